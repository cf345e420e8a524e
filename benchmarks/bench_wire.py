"""The protocol boundary's cost on the costliest lines it can be sent, against json.loads.

The runner parses every request line on its event loop, so the checks `protocol/wire.py` makes while
decoding (UTF-8, finite numbers, 64-bit integers, nesting depth, lone surrogates) and pydantic's
validation must stay linear in the line. Each shape fills a line to MAX_LINE (1 MiB); the figure is
the median time of `protocol.parse_request` and of a bare `json.loads` of the same bytes (which
accepts what the protocol refuses: NaN, huge integers, lone surrogates), and their ratio. Typical
requests are timed the same way, a few hundred bytes each.

    python benchmarks/bench_wire.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable

from goaltender.protocol import messages as p

ROOM = p.MAX_LINE - 200
HEAD = b'{"type": "run_experiment", "id": 1, "goal_id": 1, "command": ["x"], "description": "d", "params": '
SHAPES = {
    "a list of small ints": HEAD + b'{"a": [' + b",".join([b"7"] * (ROOM // 2)) + b"]}}",
    "nested lists": HEAD + b'{"a": [' + b",".join([b"[[[1]]]"] * (ROOM // 8)) + b"]}}",
    "many keys": HEAD + b"{" + b",".join(b'"k%d": 1' % i for i in range(ROOM // 13)) + b"}}",
    "lone surrogates": b'{"type": "milestone", "id": 1, "title": "' + b"\\ud800" * (ROOM // 6) + b'"}',
    "one huge integer": b'{"id": ' + b"9" * ROOM + b"}",
    "open brackets": b"[" * ROOM,
    "typical: a milestone": b'{"type": "milestone", "id": 7, "goal_id": 1, "title": "baseline done", "text": "'
    + b"x" * 300
    + b'"}',
}


def median_seconds(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        with contextlib.suppress(ValueError, RecursionError):  # json.loads refuses some shapes
            work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(
        f"| line ({p.MAX_LINE // 1024} KiB, unless typical) | parse_request (ms) | json.loads (ms) | ratio |"
    )
    print("|---|---:|---:|---:|")
    for name, line in SHAPES.items():
        ours = median_seconds(lambda line=line: p.parse_request(line), args.repeat)
        bare = median_seconds(lambda line=line: json.loads(line), args.repeat)
        print(f"| {name} | {ours * 1000:.2f} | {bare * 1000:.2f} | {ours / bare:.1f} |")


if __name__ == "__main__":
    main()
