"""The start-up self-test: this interpreter reads budgets right, Debian 12's re bugs are found by
matching, and on a Python that misreads budgets the runner, the bot, the CLI and doctor say so.

A misreading Python is made by replacing one pattern in a real goaltender process (the duration
pattern reads nothing), as 3.11.2 did with the possessive patterns.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import goaltender
from goaltender.runner.doctor import check_python
from goaltender.selftest import engine_bugs, interpreter_problem, misread_samples

DEBIAN_PYTHON = Path("/usr/bin/python3")
MISREAD = "import re; from goaltender.protocol import budget; budget._DURATION = re.compile('(?!)'); "


def test_this_interpreter_reads_every_sample_right():
    assert misread_samples() == []
    assert interpreter_problem() is None


@pytest.mark.skipif(not DEBIAN_PYTHON.exists(), reason="no /usr/bin/python3 here")
def test_the_engine_bugs_are_found_by_matching_on_the_system_python():
    """Debian 12's 3.11.2 has both bugs (fixed in 3.11.5); found by running their reproducers."""
    probe = "import platform; from goaltender.selftest import engine_bugs; print(platform.python_version(), *engine_bugs())"
    src = Path(goaltender.__file__).parent.parent  # stdlib only: no venv needed
    done = subprocess.run(
        [DEBIAN_PYTHON, "-I", "-c", f"import sys; sys.path.insert(0, {str(src)!r}); {probe}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    version, *bugs = done.stdout.split()
    fixed = tuple(map(int, version.split(".")[:3])) >= (3, 11, 5)
    assert bugs == ([] if fixed else ["gh-106052", "gh-100061"]), done.stderr


def run_misreading(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GOALTENDER_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-c", MISREAD + code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )


def assert_one_line_naming_the_interpreter(stderr: str, prefix: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(prefix), stderr
    assert (
        f"Python {'.'.join(map(str, sys.version_info[:3]))} ({sys.executable}) misreads budgets" in lines[0]
    )
    assert "`3m` read as None, not 180.0" in lines[0] and "Python 3.11.5 or newer" in lines[0]


def test_the_runner_refuses_to_start_on_a_misreading_python(tmp_path):
    done = run_misreading("from goaltender.cli import main; raise SystemExit(main(['runner']))", tmp_path)
    assert done.returncode == 1
    assert_one_line_naming_the_interpreter(done.stderr, "goaltender runner: cannot start: ")
    assert not (tmp_path / "home").exists() or not list((tmp_path / "home").rglob("*.db"))  # nothing started


def test_the_bot_refuses_to_start_on_a_misreading_python(tmp_path):
    done = run_misreading("from goaltender.cli import main; raise SystemExit(main(['bot']))", tmp_path)
    assert done.returncode == 2
    assert_one_line_naming_the_interpreter(done.stderr, "goaltender bot: cannot start: ")


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "reach 90%, budget 2h"],
        ["budget", "1", "+2h"],
        ["demo", "--yes", "reach 90%, budget 3m"],
        ["demo", "--yes"],
    ],
)
def test_cli_commands_that_read_budgets_refuse_on_a_misreading_python(tmp_path, argv):
    done = run_misreading(f"from goaltender.cli import main; raise SystemExit(main({argv!r}))", tmp_path)
    assert done.returncode == 2
    assert_one_line_naming_the_interpreter(done.stderr, "goaltender: ")


def test_doctor_fails_python_on_a_misreading_interpreter(tmp_path):
    code = "from goaltender.runner.doctor import check_python; v = check_python(None); print(v.status, v.detail, v.fix)"
    done = run_misreading(code, tmp_path)
    assert done.stdout.startswith("fail "), done.stdout + done.stderr
    assert "misreads budgets: `3m` read as None, not 180.0" in done.stdout and "3.11.5" in done.stdout


def test_doctor_names_the_engine_bugs_it_finds(monkeypatch):
    verdict = check_python(None)  # type: ignore[arg-type]  # the check reads no box
    assert verdict.status == ("warn" if engine_bugs() else "ok")
    monkeypatch.setattr("goaltender.runner.doctor.engine_bugs", lambda: ["gh-106052"])
    verdict = check_python(None)  # type: ignore[arg-type]
    assert verdict.status == "warn" and "CPython gh-106052" in verdict.detail and "3.11.5" in verdict.fix
