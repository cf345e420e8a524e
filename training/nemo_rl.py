"""`python -m goaltender.training.nemo_rl run RECIPE --config … -- overrides`: one NeMo RL run, as
`goaltender nemo-rl` has the runner start it (the experiment's command, under its supervision).

It routes the run's files into the experiment's directory (logger.log_dir and
checkpointing.checkpoint_dir overrides) and NeMo RL's per-worker venvs into the runner's cache
(the runner routes the HF, uv, torch and triton caches already), starts the trainer in the NeMo RL
checkout (`uv run examples/run_sft.py --config … overrides`) and passes its output through to
run.log. While it runs it
- sends its scalars to the runner as this experiment's series (LogMetrics): from the TensorBoard
  event files when a reader is installed (the `nemo` extra), else parsed from its stdout;
- notes each finished checkpoint (`step_N`, never `tmp_step_N`).
When it ends, it names the best checkpoint by the headline metric, prints `metric: value` and
`best_checkpoint_step: N` (the summary lines the runner reads into the ledger row), and posts the
milestone "best checkpoint: step_N (metric value)" naming the curves the bot draws for it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, RunnerUnavailable
from goaltender.runner.report import BEST_CHECKPOINT_STEP
from goaltender.storage.direction import sign
from goaltender.storage.records import Curves, MetricPoint
from goaltender.training import tb_events
from goaltender.training.checkpoints import (
    CheckpointWatch,
    Direction,
    best_checkpoint,
    finished_checkpoints,
)
from goaltender.training.launch import RECIPES
from goaltender.training.stdout_metrics import StdoutMetrics
from goaltender.training.tb_events import EventDirectory, Scalar

POLL_S = 1.0  # how often the event files and the checkpoint directory are looked at
DRAIN_S = 5.0  # after the trainer exits, how long its output may take to end
EXIT_POLL_S = 0.05  # how soon the trainer's exit is seen
BATCH = 2000  # metric points per LogMetrics request (well under the protocol's line limit)
NOT_STREAMED = ("ray/",)  # GPU telemetry, per node and GPU: not training curves
LOSS = "train/loss"
LOG_DIR, CHECKPOINT_DIR = "logger.log_dir", "checkpointing.checkpoint_dir"


def say(text: str) -> None:
    """A line of the launcher's own in run.log (never a `name: value` summary line)."""
    print(f"goaltender nemo-rl: {text}", flush=True)


# ---- what to start, and where its files go ----


@dataclass
class RunPlan:
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    log_dir: Path
    checkpoint_dir: Path
    tensorboard: bool  # read the event files (else stdout)


def plan_run(args: argparse.Namespace, environ: Mapping[str, str]) -> RunPlan:
    run_dir = Path(args.dir or environ.get("GOALTENDER_EXPERIMENT_DIR") or "nemo-rl-run").resolve()
    checkout = Path(args.checkout) if args.checkout else None
    cwd = checkout or Path.cwd()
    tensorboard = tb_events.available() and not _disabled(args.overrides, "logger.tensorboard_enabled")
    routed = {
        LOG_DIR: str(run_dir / "logs"),
        CHECKPOINT_DIR: str(run_dir / "checkpoints"),
        "logger.tensorboard_enabled": "true" if tensorboard else None,
        # Goaltender is the tracker here; W&B without a key would stop the run at a login prompt.
        "logger.wandb_enabled": None if environ.get("WANDB_API_KEY") else "false",
    }
    ours = [f"{key}={value}" for key, value in routed.items() if value is not None]
    return RunPlan(
        argv=[*_trainer(args, checkout), "--config", args.config, *ours, *args.overrides],  # theirs win
        cwd=cwd,
        env=run_environment(environ, checkout, run_dir),
        log_dir=cwd / _last_value(LOG_DIR, [*ours, *args.overrides]),
        checkpoint_dir=cwd / _last_value(CHECKPOINT_DIR, [*ours, *args.overrides]),
        tensorboard=tensorboard,
    )


def _trainer(args: argparse.Namespace, checkout: Path | None) -> list[str]:
    if args.trainer:
        return shlex.split(args.trainer)
    if checkout is None:
        raise SystemExit("goaltender nemo-rl: --checkout is needed unless --trainer is given")
    script = args.script or RECIPES[args.recipe]
    if (checkout / ".venv").is_dir() and not writable(checkout):
        # The sandbox shows the checkout read-only: its venv, synced outside it (`uv sync`), is used
        # as it is (--no-sync: no lock, no sync, no write to the checkout).
        return ["uv", "run", "--no-sync", script]
    return ["uv", "run", script]


def writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK)


def _last_value(key: str, overrides: list[str]) -> str:
    """The value the trainer ends up with for `key` (later overrides win, as in NeMo RL)."""
    values = [o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+") == key]
    return values[-1]


def _disabled(overrides: list[str], key: str) -> bool:
    values = [o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+") == key]
    return bool(values) and values[-1].lower() in ("false", "0", "no")


def worker_venvs(cache: Path) -> Path:
    """Where NeMo RL builds its per-worker venvs, under a goal's cache (unless the box says)."""
    return cache / "nemo-rl" / "venvs"


def run_environment(environ: Mapping[str, str], checkout: Path | None, run_dir: Path) -> dict[str, str]:
    """The trainer's environment: NeMo RL's and NeMo Gym's per-worker venvs in the cache on the big
    disk (shared by runs: they take minutes to build), not in the checkout."""
    env = dict(environ)
    cache = Path(env.get("GOALTENDER_CACHE_DIR") or run_dir / "cache")
    env.setdefault("NEMO_RL_VENV_DIR", str(worker_venvs(cache)))
    env.setdefault("NEMO_GYM_VENV_DIR", str(cache / "nemo-gym" / "venvs"))
    if "HF_HOME" in env:  # NeMo Gym points the datasets cache at ./cache when it is unset
        env.setdefault("HF_DATASETS_CACHE", str(Path(env["HF_HOME"]) / "datasets"))
    if checkout is not None and not (checkout / ".venv").exists() and not writable(checkout):
        # A read-only checkout without a venv: uv builds the project's env in the cache instead.
        env.setdefault("UV_PROJECT_ENVIRONMENT", str(cache / "nemo-rl" / f"env-{checkout.name}"))
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---- the runner ----


@dataclass
class RunnerLink:
    """The run's way to its goal: the experiment's series and the closing milestone."""

    client: RunnerClient
    goal_id: int
    experiment_id: int
    failed: bool = False

    @classmethod
    async def open(cls, environ: Mapping[str, str]) -> RunnerLink | None:
        """Connected when run as an experiment (the runner set the GOALTENDER_* variables)."""
        try:
            socket = environ["GOALTENDER_SOCKET"]
            goal_id, experiment_id = (
                int(environ["GOALTENDER_GOAL_ID"]),
                int(environ["GOALTENDER_EXPERIMENT_ID"]),
            )
        except (KeyError, ValueError):
            say("not run as a goal's experiment: metrics and milestone stay in this log")
            return None
        try:
            client = await RunnerClient.connect_unix(socket, client="nemo-rl")
        except (RunnerUnavailable, OSError) as exc:
            say(f"cannot reach the runner ({exc}): metrics and milestone stay in this log")
            return None
        return cls(client, goal_id, experiment_id)

    async def send(self, scalars: list[Scalar]) -> None:
        points = [MetricPoint(name=s.tag, value=s.value, step=s.step) for s in scalars]
        for start in range(0, len(points), BATCH):
            await self._call(
                p.LogMetrics,
                points=points[start : start + BATCH],
                experiment_id=self.experiment_id,
            )

    async def milestone(self, title: str, text: str, curves: Curves | None) -> None:
        await self._call(p.ReportMilestone, title=title[:300], text=text, curves=curves)

    async def _call(self, kind: type[p.LogMetrics] | type[p.ReportMilestone], **fields: object) -> None:
        if self.failed:
            return
        try:
            await self.client.request(kind(goal_id=self.goal_id, **fields))
        except (p.ProtocolError, RunnerUnavailable) as exc:
            self.failed = True  # the goal ended or the runner went: training goes on regardless
            say(f"the runner did not take {kind.model_fields['type'].default}: {exc}; no more reports")


# ---- the run ----


@dataclass
class Progress:
    """What the run has shown so far: its series by tag and step, its finished checkpoints."""

    checkpoints: CheckpointWatch
    series: dict[str, dict[int, float]] = field(default_factory=dict)

    def record(self, scalars: list[Scalar]) -> list[Scalar]:
        """Keep the scalars; return those for the runner (telemetry left out)."""
        for s in scalars:
            self.series.setdefault(s.tag, {})[s.step] = s.value
        return [s for s in scalars if not s.tag.startswith(NOT_STREAMED)]


async def supervise(plan: RunPlan, link: RunnerLink | None, metric: str) -> tuple[int, Progress]:
    """Run the trainer to its end, streaming its metrics and noting its checkpoints."""
    progress = Progress(CheckpointWatch(plan.checkpoint_dir))
    events = EventDirectory(plan.log_dir) if plan.tensorboard else None
    from_stdout = StdoutMetrics()
    if events:
        say(f"metrics from the TensorBoard files under {plan.log_dir}")
    elif tb_events.available():
        say("TensorBoard is off (logger.tensorboard_enabled): metrics from the trainer's output")
    else:
        say("no TensorBoard reader here (goaltender's nemo extra): metrics from the trainer's output")
    say(f"starting: {shlex.join(plan.argv)} (in {plan.cwd})")
    proc = await asyncio.create_subprocess_exec(
        *plan.argv,
        cwd=plan.cwd,
        env=plan.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    passing = asyncio.ensure_future(pass_through(proc.stdout, from_stdout))
    exited = asyncio.ensure_future(_exit_code(proc))
    read_any_events = False

    async def look() -> None:
        nonlocal read_any_events
        scalars = await asyncio.to_thread(events.read_new) if events else from_stdout.take()
        read_any_events |= bool(events and scalars)
        if read_any_events:
            from_stdout.take()  # the event files are the record: the stdout values are not kept
        await _report(progress.record(scalars), link)
        for checkpoint in progress.checkpoints.new():
            value = progress.series.get(metric, {}).get(checkpoint.step)
            say(f"checkpoint {checkpoint.name}" + (f" ({metric} {value:g})" if value is not None else ""))

    while not exited.done():
        await asyncio.wait({exited}, timeout=POLL_S)
        await look()
    # Its output ends with it, unless a process it left (a dataloader worker, a Ray daemon) holds
    # its stdout: the run is over when the trainer is, whatever its descendants hold.
    if not (await asyncio.wait({passing}, timeout=DRAIN_S))[0]:
        passing.cancel()
        say("the trainer exited, but a process it left holds its output: not waiting for it")
    await look()
    if events and not read_any_events:  # no event files after all (TensorBoard off in the config)
        say("no TensorBoard scalars were written: using the values in the trainer's output")
        await _report(progress.record(from_stdout.take()), link)
    return proc.returncode or 0, progress


async def _exit_code(proc: asyncio.subprocess.Process) -> int:
    """The trainer's exit code as soon as it exits. Not Process.wait(), which (Python 3.11) waits
    for its output to close too: a process it left (a dataloader worker, a Ray daemon) may hold it."""
    while proc.returncode is None:  # noqa: ASYNC110 (no event says it; only wait() does, late)
        await asyncio.sleep(EXIT_POLL_S)
    return proc.returncode


async def _report(scalars: list[Scalar], link: RunnerLink | None) -> None:
    if scalars and link is not None:
        await link.send(scalars)


async def pass_through(stream: asyncio.StreamReader, parser: StdoutMetrics) -> None:
    """The trainer's output into run.log as it comes, each whole line to the stdout parser."""
    out = sys.stdout.buffer
    pending = b""
    while chunk := await stream.read(64 * 1024):
        out.write(chunk)
        out.flush()
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            parser.feed(line.decode(errors="replace"))
    if pending:
        parser.feed(pending.decode(errors="replace"))
        out.write(b"\n")  # the launcher's own lines start on a line of their own
        out.flush()


# ---- the end: the best checkpoint ----


def best_in_series(series: Mapping[int, float], direction: Direction) -> tuple[int, float] | None:
    if not series:
        return None
    return max(series.items(), key=lambda step_value: (sign(direction) * step_value[1], step_value[0]))


async def finish(
    args: argparse.Namespace, plan: RunPlan, progress: Progress, link: RunnerLink | None, code: int
) -> None:
    """Name the best checkpoint: summary lines for the ledger row, a milestone for the thread."""
    metric, direction = args.metric, args.direction
    series = progress.series.get(metric, {})
    best = best_checkpoint(finished_checkpoints(plan.checkpoint_dir), metric, direction, series)
    if best is not None:
        summary = {metric: best.value, BEST_CHECKPOINT_STEP: float(best.checkpoint.step)}
        title = f"best checkpoint: {best.checkpoint.name} ({metric} {best.value:.4g})"
        where = f"`{best.checkpoint.path}`"
    elif (top := best_in_series(series, direction)) is not None:
        summary = {metric: top[1]}
        title = f"NeMo RL {args.recipe}: no checkpoint kept; best {metric} {top[1]:.4g} at step {top[0]}"
        where = "no finished checkpoint (is checkpointing.enabled off?)"
    else:
        say(f"the run logged no {metric}: no best checkpoint to name")
        return
    for name, value in summary.items():
        print(f"{name}: {value:g}" if name == BEST_CHECKPOINT_STEP else f"{name}: {value!r}", flush=True)
    if link is None:
        return
    steps = max((step for values in progress.series.values() for step in values), default=0)
    outcome = "finished" if code == 0 else f"ended with exit code {code}"
    text = f"NeMo RL {args.recipe} {outcome} after {steps} steps; {where}."
    if loss := progress.series.get(LOSS):
        text += f"\n{LOSS} {loss[min(loss)]:.4g} → {loss[max(loss)]:.4g}"
    drawn = [name for name in dict.fromkeys([LOSS, metric]) if name in progress.series]
    mark = float(best.checkpoint.step) if best is not None else None
    curves = Curves(experiment_id=link.experiment_id, series=drawn, mark_step=mark) if drawn else None
    await link.milestone(title, text, curves)


async def run(args: argparse.Namespace) -> int:
    plan = plan_run(args, os.environ)
    # The runner's SIGTERM (timeout, stop) reaches the trainer too (one process group): the launcher
    # outlives it, to name the best checkpoint so far within the grace period.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: None)
    link = await RunnerLink.open(os.environ)
    try:
        code, progress = await supervise(plan, link, args.metric)
        await finish(args, plan, progress, link, code)
    finally:
        if link is not None:
            await link.client.close()
    return code if code >= 0 else 128 - code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m goaltender.training.nemo_rl")
    sub = parser.add_subparsers(dest="action", required=True)
    cmd = sub.add_parser("run", help="run NeMo RL and report on it (what `goaltender nemo-rl` starts)")
    cmd.add_argument("recipe", choices=sorted(RECIPES))
    cmd.add_argument("--config", required=True)
    cmd.add_argument("--metric", required=True)
    cmd.add_argument("--direction", choices=["maximize", "minimize"], required=True)
    cmd.add_argument("--checkout", help="the NeMo RL checkout (the trainer runs there)")
    cmd.add_argument("--script", help="the entry point in the checkout (default: the recipe's)")
    cmd.add_argument(
        "--trainer", help="a command instead of `uv run <script>` (gets --config and the overrides)"
    )
    cmd.add_argument("--dir", help="where logs and checkpoints go (default: $GOALTENDER_EXPERIMENT_DIR)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`run RECIPE [options] -- overrides`: what follows `--` goes to the trainer as it is."""
    words = sys.argv[1:] if argv is None else argv
    cut = words.index("--") if "--" in words else len(words)
    args = build_parser().parse_args(words[:cut])
    args.overrides = words[cut + 1 :]
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
