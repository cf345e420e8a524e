"""Supervision that nothing a run prints escapes (runner/supervisor.py).

A run's output is the agent's to choose. One line used to end its supervision: the metric parser
caught only JSON decode errors, so `{"x": 1` + 400 zeros + `}` (an OverflowError), a 5,000-digit
number (ValueError) or deep nesting (RecursionError) raised out of `run_supervised`, whose
`finally` cancelled the timeout: the run outlived it, left its slot, was not charged, survived a
stop, and its row stayed `running`. And a burst of output was read in one piece on the event loop:
the runner's memory grew with it and every reply waited.

Here: the parser and the log reader, fuzzed (any bytes, any lines: read or counted, never raised,
and chunked reading finds what reading the whole file would); the poison lines through the real
runner (killed at the timeout, charged, the slot held until then, `goaltender stop` works); a
burst of 200 MB while a client keeps asking for status (replies keep coming, memory stays flat).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import BIN, events_until_report, eventually, submit, write_agent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goaltender.bot.gallery import analysis_text
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.runner.supervisor import (
    MAX_LINE,
    MAX_SUMMARY,
    Launch,
    LiveMetrics,
    MetricParser,
    SupervisionFailed,
    group_alive,
    run_supervised,
)

SEEDED = {"derandomize": True, "database": None}

# Each raised out of the old parser (or, the surrogate, out of the metrics write after it).
POISON = [
    '{"x": 1' + "0" * 400 + "}",  # float() of the int: OverflowError
    '{"x": ' + "1" * 5000 + "}",  # past int()'s 4,300 digits: ValueError
    '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}",  # RecursionError
    '{"step": 1' + "0" * 400 + ', "x": 1}',  # the step: OverflowError
    '{"\\ud800": 1, "y": 2}',  # a lone surrogate as a metric's name: no UTF-8 can store it
]

NESTED = '{"x": ' + "[" * 1100 + "]" * 1100 + "}"  # past the recursion limit (1,000), at 2 kB

# ---- the parser and the reader, fuzzed ----

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
NAMES = st.from_regex(r"[A-Za-z_][\w./-]{0,20}", fullmatch=True)
LINES = st.one_of(
    st.text(),
    st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=5).map(json.dumps),  # NaN, Infinity too
    st.builds(lambda name, value: f"{name}: {value}", NAMES, st.text(max_size=12) | st.floats().map(str)),
    st.sampled_from(POISON),
    st.sampled_from(POISON).map(lambda line: f"  {line}\r"),
)


@settings(max_examples=400, deadline=None, **SEEDED)
@given(lines=st.lists(LINES, max_size=20))
def test_the_metric_parser_reads_any_line_or_counts_it(lines):
    parser = MetricParser()
    for line in lines:
        for point in parser.feed(line):
            assert math.isfinite(point.value) and (point.step is None or math.isfinite(point.step))
            point.name.encode()  # text the store can hold
    assert len(parser.summary) <= MAX_SUMMARY
    assert all(math.isfinite(value) for value in parser.summary.values())
    assert 0 <= parser.unreadable <= len(lines)


@settings(max_examples=200, deadline=None, **SEEDED)
@given(metrics=st.dictionaries(NAMES, st.floats(allow_nan=False, allow_infinity=False), min_size=1))
def test_a_metric_line_still_gives_its_points(metrics):
    step = metrics.pop("step", None)
    parser = MetricParser()
    points = parser.feed(json.dumps({**metrics, "step": step}))
    assert [(pt.name, pt.value, pt.step) for pt in points] == [(k, v, step) for k, v in metrics.items()]
    assert parser.unreadable == 0


def test_the_poison_lines_are_read_as_far_as_they_can_be():
    parser = MetricParser()
    read = [[(pt.name, pt.value, pt.step) for pt in parser.feed(line)] for line in POISON]
    # Numbers past a float are no numbers (as 1e400 always was); the surrogate name is dropped.
    assert read == [[], [], [], [("x", 1.0, None)], [("y", 2.0, None)]]
    assert parser.unreadable == 1  # the nesting: no JSON this parser can read


PIECES = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [b"\n", b"\r\n", b"{", b"}", b":", b"=", b"acc: 0.5\n", b"loss=1e-3\n", b'{"loss": 1.5, "step": 2}\n']
    ),
    # The poison, as short as it comes: a small chunk takes many reads of a long line.
    st.sampled_from([line.encode() + b"\n" for line in (*POISON[:2], *POISON[3:], NESTED)]),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    **SEEDED,
)
@given(
    writes=st.lists(st.lists(PIECES, max_size=8).map(b"".join), max_size=10),
    chunk=st.sampled_from([16, 256, 4096]),
    max_line=st.sampled_from([8, 100, MAX_LINE]),
)
def test_the_log_reader_takes_any_bytes_and_finds_what_a_whole_read_would(writes, chunk, max_line):
    """The log is read a chunk at a time while it grows: it gives the points, summary and count
    of unreadable lines that reading the finished file at once would (lines over `max_line`
    skipped and counted), and never raises."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = root / "experiments" / "001" / "run.log"
        log.parent.mkdir(parents=True)
        delivered = []

        async def on_points(points):
            delivered.extend(points)

        live = LiveMetrics(root, log, on_points, chunk=chunk, max_line=max_line)

        async def follow():
            for data in writes:
                with log.open("ab") as f:
                    f.write(data)
                await live.drain()
                assert all(len(tail.partial) <= max_line for tail in live.tails)
            await live.drain(final=True)

        asyncio.run(follow())

    lines = b"".join(writes).split(b"\n")
    whole = MetricParser()
    expected = [
        pt for line in lines if len(line) <= max_line for pt in whole.feed(line.decode(errors="replace"))
    ]
    assert delivered == expected
    assert live.summary == whole.summary
    assert live.unreadable == whole.unreadable + sum(len(line) > max_line for line in lines)


async def test_a_line_without_end_is_never_held_whole(tmp_path):
    """20 MB with no newline grew the reader's buffer by as much; past MAX_LINE it is skipped to
    its newline, counted once, and the lines after it are read."""
    log = tmp_path / "experiments" / "001" / "run.log"
    log.parent.mkdir(parents=True)
    live = LiveMetrics(tmp_path, log, _no_points)
    with log.open("ab") as f:
        for _ in range(20):
            f.write(b"x" * 1_000_000)
            f.flush()
            await live.drain()
            assert all(len(tail.partial) <= MAX_LINE for tail in live.tails)
        f.write(b"\nacc: 0.5\n")
    await live.drain(final=True)
    assert live.summary == {"acc": 0.5} and live.unreadable == 1


async def test_a_log_followed_again_is_skimmed_for_its_summary_alone(tmp_path):
    """After a runner restart a remote run's log is read again for its summary (its points were
    delivered before), to its end however long it is, and copying resumes after it."""
    log = tmp_path / "experiments" / "001" / "run.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b'{"loss": 1}\n' * 100_000 + b"acc: 0.5\n")

    delivered = []

    async def on_points(points):
        delivered.extend(points)

    live = LiveMetrics(tmp_path, log, on_points)
    await live.skim()
    assert live.summary == {"acc": 0.5} and live.tails[0].offset == log.stat().st_size
    assert delivered == []


@settings(max_examples=300, deadline=None, **SEEDED)
@given(
    raw=st.one_of(
        st.binary(),
        JSON_VALUES.map(lambda v: json.dumps({"text": v}).encode()),
        st.sampled_from([line.encode() for line in POISON]),
    )
)
def test_an_errors_json_of_any_bytes_gives_an_analysis_or_none(raw):
    assert isinstance(analysis_text(raw), str)


# ---- run_supervised itself: a fault of the runner's own while it follows a run ----


def _launch(tmp_path: Path, code: str) -> Launch:
    return Launch(argv=[sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ))


async def _no_points(points) -> None:
    return None


async def test_points_the_store_cannot_take_leave_the_run_supervised(tmp_path):
    pids = []

    async def on_start(pid: int) -> None:
        pids.append(pid)

    async def failing(points) -> None:
        raise RuntimeError("the store is broken")

    code = "import time\nfor i in range(3): print('{\"x\": %d}' % i, flush=True)\nprint('acc: 0.5', flush=True)\ntime.sleep(60)"
    result = await run_supervised(
        _launch(tmp_path, code),
        log_path=tmp_path / "run.log",
        beneath=tmp_path,
        timeout_s=1.0,
        on_points=failing,
        on_start=on_start,
        grace_s=1.0,
    )
    assert result.timed_out and result.wall_seconds >= 1.0 and result.summary == {"acc": 0.5}
    assert not group_alive(pids[0])


async def test_a_fault_in_following_kills_the_run_and_measures_it(tmp_path):
    pids = []

    async def on_start(pid: int) -> None:
        pids.append(pid)
        raise RuntimeError("cannot record where it runs")

    with pytest.raises(SupervisionFailed) as failed:
        await run_supervised(
            _launch(tmp_path, "import time; time.sleep(60)"),
            log_path=tmp_path / "run.log",
            beneath=tmp_path,
            timeout_s=None,
            on_points=_no_points,
            on_start=on_start,
            grace_s=1.0,
        )
    assert not group_alive(pids[0])
    assert failed.value.result.signal is not None and failed.value.result.wall_seconds > 0


# ---- through the real runner ----

POISON_SCRIPT = f"""
cat > poison.py <<'EOF'
import sys, time
POISON = {POISON!r}
for i in sys.argv[1:]:
    print(POISON[int(i)], flush=True)
print('{{"after": %s}}' % sys.argv[-1], flush=True)
time.sleep(300)
EOF
"""


def poison_agent(tmp_path: Path, runs: str) -> list[str]:
    return write_agent(tmp_path, "a.sh", POISON_SCRIPT + runs)


async def test_a_poisoned_run_is_killed_at_its_timeout_charged_and_holds_its_slot(
    start_runner, connect, tmp_path
):
    """Each poison line, then a sleep past the timeout; all asked for at once with one slot. Each
    run is killed at its timeout and charged, its row ends, and the next starts only after it."""
    runs = "".join(
        f"goaltender experiment -d 'poison {i}' --metric acc --timeout 2s -- python poison.py {i} &\n"
        for i in range(len(POISON))
    )
    runs += "goaltender experiment -d clean --metric acc -- python -c 'print(\"acc: 1\")' &\nwait\n"
    runner = await start_runner(agents={"a": poison_agent(tmp_path, runs)}, slots=1, compute_unit="cpu")
    client = await connect(runner)
    goal_id = await submit(client, "poison, max 10 experiments", agent="a")
    await events_until_report(client, goal_id, timeout=180)

    summary = await client.request(p.Summary(goal_id=goal_id))
    rows = sorted(summary.ledger, key=lambda row: row.started_at)
    assert len(rows) == len(POISON) + 1 and summary.status.attempted == len(rows)
    for before, after in itertools.pairwise(rows):
        assert before.ended_at is not None and after.started_at >= before.ended_at  # one slot, held
    poisoned = [row for row in rows if row.description.startswith("poison")]
    for row in poisoned:
        assert row.status == "crash" and row.note.startswith("timeout after 2s"), row
        assert row.wall_seconds >= 2 and row.cpu_seconds > 0 and row.compute_hours > 0
    nested = next(row for row in poisoned if row.description == "poison 2")
    assert nested.note == "timeout after 2s; 1 unreadable output line skipped " + (
        f"(a {{…}} line that is not a JSON object, or a line over {MAX_LINE // 2**20} MiB)"
    )
    # Read on after the poison: each run's next line arrived.
    after = await client.request(p.GetSeries(goal_id=goal_id, name="after"))
    assert sorted(value for _, value in after.points) == [float(i) for i in range(len(POISON))]
    assert summary.status.compute_hours_used == pytest.approx(sum(row.compute_hours for row in rows))


async def test_stop_ends_a_goal_whose_run_printed_poison(start_runner, connect, tmp_path):
    every = " ".join(str(i) for i in range(len(POISON)))
    agent = poison_agent(
        tmp_path, f"goaltender experiment -d poison --metric acc -- python poison.py {every}\n"
    )
    runner = await start_runner(agents={"a": agent}, compute_unit="cpu")
    client = await connect(runner)
    goal_id = await submit(client, "poison, max 3 experiments", agent="a")

    async def read_past_the_poison():
        series = await client.request(p.GetSeries(goal_id=goal_id, name="after"))
        return bool(series.points)

    await eventually(read_past_the_poison, timeout=60)
    running = (await client.request(p.Status(goal_id=goal_id))).goals[0].running
    assert running is not None and running.pid and group_alive(running.pid)

    stop = await asyncio.create_subprocess_exec(
        f"{BIN}/goaltender",
        "--socket",
        str(runner.settings.socket_path),
        "stop",
        str(goal_id),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _out, err = await asyncio.wait_for(stop.communicate(), 60)
    assert stop.returncode == 0, err
    assert not group_alive(running.pid)
    summary = await client.request(p.Summary(goal_id=goal_id))
    assert summary.status.goal.state == "stopped"
    [row] = summary.ledger
    assert row.status == "crash" and row.note.startswith("ended with the goal: stopped by")
    assert row.cpu_seconds > 0 and row.compute_hours > 0


# ---- a burst of output ----

# Megabytes of lines each of which the reader must look at (`:` and `=` in plain text), or of
# series points (each stored, each a point of a loss curve the runner inspects at the end).
BURSTS = {
    "text": (200, r'b"train step 1234567: loss=0.25 lr=1e-4\n" * 27_000'),
    "series": (30, r"""b"".join(b'{"loss": %d, "step": %d}\n' % (i, i) for i in range(34_000))"""),
}


def burst_agent(kind: str) -> str:
    megabytes, block = BURSTS[kind]
    script = f"import sys\nblock = {block}  # ~1 MB\nfor _ in range({megabytes}):\n"
    script += "    sys.stdout.buffer.write(block)\nsys.stdout.buffer.flush()\nprint('acc: 0.5', flush=True)\n"
    return f"cat > burst.py <<'EOF'\n{script}EOF\ngoaltender experiment -d burst --metric acc -- python burst.py\n"


class PeakRss:
    """This process's (the runner's) peak RSS over a stretch, sampled by a thread of its own so
    that a blocked event loop does not stop the sampling."""

    def __init__(self):
        self.process = psutil.Process()
        self.base = self.peak = self.process.memory_info().rss
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self.done.wait(0.01):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20


class StatusPinger:
    """A client of its own, in a thread of its own, asking for a goal's status over and over:
    how long each reply took, the runner's event loop blocked or not."""

    def __init__(self, socket: Path, goal_id: int):
        self.socket, self.goal_id = socket, goal_id
        self.waits: list[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._ask()), daemon=True)

    async def _ask(self):
        client = await RunnerClient.connect_unix(self.socket, client="pinger")
        try:
            while not self.done.is_set():
                asked = time.monotonic()
                await asyncio.wait_for(client.request(p.Status(goal_id=self.goal_id)), 120)
                self.waits.append(time.monotonic() - asked)
                await asyncio.sleep(0.05)  # pacing: a reply is asked for about 20 times a second
        finally:
            await client.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(timeout=180)


@pytest.mark.parametrize("kind", BURSTS)
async def test_a_burst_of_output_leaves_the_runner_answering_and_its_memory_flat(
    start_runner, connect, tmp_path, kind
):
    """It was read in one piece on the event loop: 200 MB of text took the runner from ~150 MB
    to ~1.2 GB and held every reply for 21 s; 50 MB of series points, +1.2 GB and 32 s (and
    then every point of its loss curve loaded at once to see whether it moved)."""
    megabytes, _ = BURSTS[kind]
    runner = await start_runner(agents={"a": write_agent(tmp_path, "a.sh", burst_agent(kind))})
    client = await connect(runner)

    async def finished() -> bool:
        status = (await client.request(p.Status(goal_id=goal_id))).goals[0]
        return status.goal.state == "finished"

    with PeakRss() as rss:
        goal_id = await submit(client, "burst, max 1 experiments", agent="a")
        started = time.monotonic()
        with StatusPinger(runner.settings.socket_path, goal_id) as pinger:
            await eventually(finished, timeout=600)
    took = time.monotonic() - started
    [row] = (await client.request(p.Summary(goal_id=goal_id))).ledger
    print(
        f"\n{kind} burst of {megabytes} MB: {len(pinger.waits)} status replies, slowest {max(pinger.waits):.2f} s; "
        f"runner RSS +{rss.growth_mb:.0f} MB (from {rss.base / 2**20:.0f} MB); goal done in {took:.1f} s"
    )
    assert Path(row.log_path).stat().st_size > megabytes * 10**6
    assert row.status == "keep" and row.metric_value == 0.5  # read to its end
    assert max(pinger.waits) < 5.0
    assert rss.growth_mb < 200


async def test_a_failed_agents_huge_log_is_quoted_from_its_end_alone(start_runner, connect, tmp_path):
    """An agent that fails is quoted from the end of its agent.log, which it writes: the whole
    file was read to take its last 1,500 bytes (300 MB of it, +300 MB in the runner)."""
    agent = write_agent(
        tmp_path, "a.sh", "head -c 300000000 /dev/zero | tr '\\0' 'x'\necho\necho 'the last words'\nexit 3\n"
    )
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    with PeakRss() as rss:
        goal_id = await submit(client, "say a lot, max 1 experiments", agent="a")
        events = await events_until_report(client, goal_id, timeout=300)
    reason = events[-1].data.end_reason
    assert "the agent exited with code 3" in reason and reason.endswith("the last words")
    assert rss.growth_mb < 100, rss.growth_mb
