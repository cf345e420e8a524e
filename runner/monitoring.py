"""Metrics for a monitoring system: a Prometheus endpoint for the runner and the bot (off unless a
port is set), and the runner's own metrics.

The endpoint is prometheus_client's HTTP server, in threads of its own: a slow or stuck scraper
never holds up the daemon's event loop. Nothing is counted twice: at each scrape a collector reads
the daemon's state where it lives (the SQLite database through the daemon's own connection, the
slots and links in memory), by running one short coroutine on the event loop — the only place that
state may be read — and waiting for it there (a loop that does not answer in time makes
`goaltender_state_read_ok` 0, and the scrape still answers). The library's process metrics (CPU,
memory, open files, GC) come along. Labels hold only state names, runner names and such: never a
goal's text, a person or a token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any, get_args

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import GaugeMetricFamily, InfoMetricFamily, Metric

from goaltender.storage.records import TERMINAL_STATES, GoalState
from goaltender.storage.space import free_space

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from goaltender.runner.daemon import Runner

log = logging.getLogger("goaltender.monitoring")

# A scrape waits this long for the event loop: well inside Prometheus's default scrape timeout (10 s),
# so that a stuck loop still gets an answer that says so.
READ_TIMEOUT_S = 5.0
ACTIVE_STATES = [state for state in get_args(GoalState) if state not in TERMINAL_STATES]

StateReader = Callable[[], Coroutine[Any, Any, list[Metric]]]


class MetricsUnavailable(Exception):
    """The metrics endpoint cannot listen where it was told to; the message says where and why."""


class LoopStateCollector:
    """A prometheus_client collector whose families are read, at each scrape, by `read` on the
    daemon's event loop (from the scrape's thread), plus `goaltender_state_read_ok`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read: StateReader):
        self.loop = loop
        self.read = read

    def collect(self) -> Iterator[Metric]:
        families = self._read_state()
        yield from families or []
        yield GaugeMetricFamily(
            "goaltender_state_read_ok",
            "1 when this scrape read the daemon's state; 0 when its event loop did not answer in time",
            value=0 if families is None else 1,
        )

    def _read_state(self) -> list[Metric] | None:
        """The state's families, or None (said in the log) when the loop did not give them."""
        reading = self.read()
        try:
            future = asyncio.run_coroutine_threadsafe(reading, self.loop)
        except RuntimeError:  # the loop has closed: the daemon is on its way out
            reading.close()
            return None
        try:
            return future.result(READ_TIMEOUT_S)
        except Exception as exc:  # the loop is stuck, or a read failed: the scrape still answers
            future.cancel()
            log.warning("metrics: could not read the state (%s)", str(exc) or repr(exc))
            return None


class MetricsEndpoint:
    """`/metrics` on address:port (port 0: any free one; `port` tells which), serving `collectors`
    and the process's own metrics."""

    def __init__(self, address: str, port: int, collectors: Iterable[object], setting: str):
        self.address = address
        self.requested_port = port
        self.setting = setting  # the variable that set the port, for the message when it is taken
        self.registry = CollectorRegistry()
        for collector in collectors:
            self.registry.register(collector)  # type: ignore[arg-type]  # (a Collector is a Protocol)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._server: WSGIServer | None = None

    @property
    def port(self) -> int | None:
        return self._server.server_port if self._server is not None else None

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> None:
        try:
            self._server, _ = start_http_server(self.requested_port, self.address, registry=self.registry)
        except OSError as exc:
            raise MetricsUnavailable(
                f"{self.setting} is {self.requested_port}: cannot serve metrics on "
                f"{self.address}:{self.requested_port} ({exc.strerror or exc})"
            ) from None
        log.info("metrics for Prometheus on %s", self.url)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def runner_endpoint(runner: Runner) -> MetricsEndpoint | None:
    """The runner's endpoint (GOALTENDER_METRICS_PORT; None when unset), not yet started."""
    settings = runner.settings
    if settings.metrics_port is None:
        return None
    loop = asyncio.get_running_loop()
    collectors = [LoopStateCollector(loop, lambda: runner_state(runner)), RunnerDisk(runner)]
    return MetricsEndpoint(
        settings.metrics_address, settings.metrics_port, collectors, "GOALTENDER_METRICS_PORT"
    )


async def runner_state(runner: Runner) -> list[Metric]:
    """What the runner is doing: its goals by state (runner.db), its slots and their queue."""
    states = await runner.store.active_goal_states()
    goals = GaugeMetricFamily(
        "goaltender_runner_goals", "Goals on this runner that have not ended, by state", labels=["state"]
    )
    for state in ACTIVE_STATES:
        goals.add_metric([state], states.get(state, 0))
    slots = runner.campaigns.slots
    waiting = slots.waiting()
    info = InfoMetricFamily("goaltender_runner", "This runner", value={"name": runner.settings.name})
    return [
        info,
        goals,
        _gauge(
            "goaltender_runner_slots", "Experiments this box runs at once (GOALTENDER_SLOTS)", slots.slots
        ),
        _gauge("goaltender_runner_slots_in_use", "Slots held by running experiments", slots.in_use),
        _gauge(
            "goaltender_runner_slot_queue_experiments", "Experiments waiting for a slot or GPUs", len(waiting)
        ),
        _gauge(
            "goaltender_runner_slot_queue_goals",
            "Goals with an experiment waiting for a slot or GPUs",
            len({each.goal_id for each in waiting}),
        ),
        _gauge("goaltender_runner_gpus", "GPUs this runner hands out (NVML)", len(slots.gpus)),
        _gauge("goaltender_runner_gpus_in_use", "GPUs held by running experiments", slots.gpus_in_use),
    ]


class RunnerDisk:
    """Free space on the runner's home's disk, measured in the scrape's thread (a statvfs; a slow
    mount then delays the scrape, not the runner)."""

    def __init__(self, runner: Runner):
        self.home = runner.settings.home
        self.min_free_bytes = runner.settings.min_free_mb * 1024 * 1024

    def collect(self) -> Iterator[Metric]:
        try:
            free = free_space(self.home).free_bytes
        except OSError as exc:
            log.warning("metrics: cannot measure the free space on %s: %s", self.home, exc)
        else:
            yield _gauge(
                "goaltender_runner_disk_free_bytes",
                "Free bytes on the disk of the runner's home (state, workspaces, caches)",
                free,
            )
        yield _gauge(
            "goaltender_runner_disk_min_free_bytes",
            "Below this free space no experiment starts and goals pause (GOALTENDER_MIN_FREE_MB)",
            self.min_free_bytes,
        )


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
