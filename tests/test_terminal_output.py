"""What the runner sends back reaches an operator's terminal without control characters.

Goal texts, stop reasons, agents' questions and runs' logs come from Slack users, agents and the
programs they run: an ESC or CSI in them would be obeyed by the terminal that shows them (colours,
a rewritten screen, a window title). The CLI cleans what it prints to a terminal (display/plain.py);
piped, its output stays exact. Tested on a real pseudo-terminal against a real runner.
"""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess

from helpers import eventually, submit, write_agent
from hypothesis import given
from hypothesis import strategies as st
from test_cli_input import GOALTENDER

from goaltender.display.plain import clean
from goaltender.protocol import messages as p

CONTROLS = {*map(chr, range(0x00, 0x20)), "\x7f", *map(chr, range(0x80, 0xA0))} - {"\n", "\t"}
HOSTILE = "red \x1b[31malert\x1b[0m \x1b]0;owned\x07title \x9b2Jcsi"

AGENT = r"""
cat > noisy.py <<'EOF'
import sys
sys.stdout.write("\x1b]0;owned\x07title\n\u009b2Jcsi\nstep 1\rstep 2\r\nacc: 0.5\n")
EOF
goaltender experiment -d "noisy output" -- python noisy.py
sleep 120
"""


@given(st.text())
def test_clean_text_has_no_control_characters_and_keeps_the_rest(text):
    shown = clean(text)
    assert not CONTROLS & set(shown)
    assert clean(shown) == shown
    kept = text.replace("\r\n", "\n").replace("\r", "\n")
    assert shown == "".join(c for c in kept if c not in CONTROLS)


def test_clean_keeps_lines_tabs_and_every_printable_character():
    assert clean("a\tb\nc ✓ é 中") == "a\tb\nc ✓ é 中"
    assert clean("progress 1\rprogress 2\r\ndone") == "progress 1\nprogress 2\ndone"


def on_terminal(argv: list[str], socket: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as its stdout and stderr: its exit code and what the
    terminal received (its own CRLF line ends read as LF)."""
    main, terminal = pty.openpty()
    environment = {**os.environ, "GOALTENDER_SOCKET": socket, **(env or {})}
    proc = subprocess.Popen(
        [GOALTENDER, *argv], stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=environment
    )
    os.close(terminal)
    received = b""
    while True:
        try:
            data = os.read(main, 1 << 16)
        except OSError:  # EIO: every writer of the terminal has gone
            break
        if not data:
            break
        received += data
    os.close(main)
    return proc.wait(timeout=60), received.decode().replace("\r\n", "\n")


def piped(argv: list[str], socket: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "GOALTENDER_SOCKET": socket}
    return subprocess.run([GOALTENDER, *argv], capture_output=True, text=True, env=environment, timeout=60)


async def test_goal_texts_and_refusals_reach_a_terminal_clean_and_a_pipe_exact(
    start_runner, connect, tmp_path
):
    runner = await start_runner(agents={"wait": write_agent(tmp_path, "wait.sh", "sleep 120\n")})
    client = await connect(runner)
    goal_id = await submit(client, f"{HOSTILE}, max 1 experiments", agent="wait")
    await client.request(p.Stop(goal_id=goal_id, reason=HOSTILE))
    socket = str(runner.settings.socket_path)

    for argv in (["status", "--all"], ["summary", str(goal_id)]):
        code, shown = await asyncio.to_thread(on_terminal, argv, socket)
        assert code == 0, shown
        assert clean(HOSTILE) in shown, shown  # "red [31malert[0m ]0;ownedtitle 2Jcsi": inert
        assert not CONTROLS & set(shown), repr(shown)
        exact = await asyncio.to_thread(piped, argv, socket)
        assert HOSTILE in exact.stdout, exact.stdout

    # A refusal quotes the stop's reason, on stderr.
    code, shown = await asyncio.to_thread(on_terminal, ["steer", str(goal_id), "more"], socket)
    assert code == 4 and "is stopped" in shown and clean(HOSTILE) in shown, shown
    assert not CONTROLS & set(shown), repr(shown)
    exact = await asyncio.to_thread(piped, ["steer", str(goal_id), "more"], socket)
    assert HOSTILE in exact.stderr, exact.stderr


async def test_a_runs_log_reaches_a_terminal_clean_and_a_pipe_exact(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"noisy": write_agent(tmp_path, "noisy.sh", AGENT)})
    client = await connect(runner)
    goal_id = await submit(client, "noisy, max 1 experiments", agent="noisy")
    [experiment] = await eventually(lambda: _ended(runner, goal_id))
    socket = str(runner.settings.socket_path)

    code, shown = await asyncio.to_thread(on_terminal, ["log", str(experiment.id)], socket)
    assert code == 0, shown
    assert "]0;ownedtitle\n2Jcsi\nstep 1\nstep 2\nacc: 0.5\n" in shown, repr(shown)
    assert not CONTROLS & set(shown), repr(shown)
    environment = {**os.environ, "GOALTENDER_SOCKET": socket}
    exact = await asyncio.to_thread(
        subprocess.run,
        [GOALTENDER, "log", str(experiment.id)],
        capture_output=True,
        env=environment,
        timeout=60,
    )
    assert "\x1b]0;owned\x07title\n\u009b2Jcsi\nstep 1\rstep 2\r\nacc: 0.5\n".encode() in exact.stdout
    await client.request(p.Stop(goal_id=goal_id))


async def _ended(runner, goal_id: int) -> list:
    experiments = await runner.store.experiments(goal_id)
    return experiments if experiments and all(e.status != "running" for e in experiments) else []
