#!/usr/bin/env bash
# Build (once) the Python 3.12 venv that runs NeMo Gym 0.4.0 and the star_count resources server,
# then print its path. Usage: environments/star_count/gym_venv.sh [VENV_DIR]
#
# nemo-gym 0.4.0 needs Python >= 3.12 (the version NeMo RL v0.7.0 pins) while goaltender runs on
# 3.11, so Gym gets a venv of its own (about 1.4 GB). It lives in the user's cache by default, so
# it survives fresh clones on a machine that keeps its cache; a stamp names what was installed, and
# a venv without a matching stamp (an interrupted or outdated build) is rebuilt from scratch.
#
# The interpreter: $GYM_PYTHON if set, else the newest 3.12.x under the pyenv root
# (`pyenv root`, else $PYENV_ROOT, else ~/.pyenv), else python3.12 on PATH.
set -euo pipefail

NEMO_GYM_VERSION=0.4.0
# pillow: export.py renders the dataset images (Gym's own requirements do not promise it).
PACKAGES=("nemo-gym==$NEMO_GYM_VERSION" "pillow")
VENV=${1:-${GOALTENDER_GYM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/goaltender/nemo-gym-$NEMO_GYM_VERSION-py3.12}}

find_python312() {
  if [ -n "${GYM_PYTHON:-}" ]; then echo "$GYM_PYTHON"; return; fi
  local root
  if command -v pyenv >/dev/null; then root=$(pyenv root); else root=${PYENV_ROOT:-$HOME/.pyenv}; fi
  local newest
  newest=$(find "$root/versions" -maxdepth 1 -name '3.12.*' -printf '%f\n' 2>/dev/null |
    grep -E '^3\.12\.[0-9]+$' | sort -t. -k3,3n | tail -n1 || true)
  if [ -n "$newest" ] && [ -x "$root/versions/$newest/bin/python3.12" ]; then
    echo "$root/versions/$newest/bin/python3.12"
  elif command -v python3.12 >/dev/null; then
    command -v python3.12
  else
    echo "gym_venv: no Python 3.12 found (looked under $root/versions and on PATH; set GYM_PYTHON)" >&2
    exit 1
  fi
}

PYTHON=$(find_python312)
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"  # one build at a time (CI and a developer may share the cache)
flock 9
STAMP_TEXT="$("$PYTHON" -c 'import platform; print(platform.python_version())') ${PACKAGES[*]}"
if [ -f "$VENV/.goaltender-stamp" ] && [ "$(cat "$VENV/.goaltender-stamp")" = "$STAMP_TEXT" ]; then
  echo "$VENV"
  exit 0
fi

echo "gym_venv: building $VENV with $PYTHON ($STAMP_TEXT)" >&2
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}" >&2
echo "$STAMP_TEXT" >"$VENV/.goaltender-stamp"
echo "$VENV"
