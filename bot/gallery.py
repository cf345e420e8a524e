"""`show examples` (or `examples`) in a goal's thread: the gallery of hard cases an experiment's
evaluation drew (the star-count evaluate.py writes `hard_cases.png` and `errors.json` beside the
run), posted in the thread with the analysis in words.

The goal's best experiment is shown, else the latest that has a gallery. The files come from the
runner (GetArtifact: a fixed list of names, read without following links), never from a path the
bot opens itself. Like `summary`, anyone in the channel may ask and the agent hears nothing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from goaltender.bot import queries, render
from goaltender.bot.links import RunnerPool
from goaltender.bot.outbox import Payload
from goaltender.protocol import messages as p
from goaltender.storage.bot_store import Thread
from goaltender.storage.records import Experiment

log = logging.getLogger("goaltender.bot")
R = TypeVar("R", bound=p.Reply)

GALLERY = "hard_cases.png"
ANALYSIS = "errors.json"
MAX_LOOKS = 20  # experiments asked for a gallery before giving up: one round trip each
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_ASKS = re.compile(r"^(?:show(?: me)?(?: the)? )?(?:examples|hard(?:est)? cases)$")


def asks_for_examples(text: str) -> bool:
    """Whether a thread reply asks for the gallery (`show examples`, `examples`, `hard cases`)."""
    words = " ".join(text.lower().split()).strip(" ?!.")
    return bool(_ASKS.match(words))


class NoAnswer(Exception):
    """The runner did not answer (down, slow, or no longer configured)."""


@dataclass(frozen=True)
class Shown:
    experiment: Experiment
    best: bool  # the goal's best experiment (else the latest with a gallery)
    png: bytes
    analysis: str  # mrkdwn, escaped; "" when errors.json was missing or unreadable


def candidates(best: Experiment | None, ledger: list[Experiment]) -> list[Experiment]:
    """The experiments to look at, in order: the best, then the newest first."""
    newest = sorted(ledger, key=lambda e: e.index, reverse=True)
    ordered = ([best] if best else []) + [e for e in newest if best is None or e.id != best.id]
    return ordered[:MAX_LOOKS]


def analysis_text(raw: bytes) -> str:
    """The analysis paragraph of an errors.json, as escaped mrkdwn ("" when there is none).
    The file lies in the agent's workspace: it is read as untrusted text."""
    try:
        text = json.loads(raw).get("text")
    except (ValueError, AttributeError, RecursionError):  # any bytes at all: nested past the limit too
        return ""
    if not isinstance(text, str):
        return ""
    return re.sub(r"\*\*(.+?)\*\*", r"*\1*", render.escape(text[:1500]))


class Gallery:
    def __init__(self, pool: RunnerPool, plots_dir: Path):
        self.pool = pool
        self.plots_dir = plots_dir

    async def _call(self, thread: Thread, request: p.Request[R]) -> R:
        try:
            return await asyncio.wait_for(self.pool[thread.runner].request(request), queries.STATUS_TIMEOUT_S)
        except p.ProtocolError:
            raise
        except queries.NO_ANSWER as exc:
            raise NoAnswer(str(exc)) from exc

    async def _artifact(self, thread: Thread, experiment: Experiment, name: str) -> bytes | None:
        """One file of the experiment (None when it has none the runner will give)."""
        try:
            reply = await self._call(thread, p.GetArtifact(experiment_id=experiment.id, name=name))
        except p.ProtocolError:
            return None
        try:
            return base64.b64decode(reply.data, validate=True)
        except (binascii.Error, ValueError):
            return None

    async def find(self, thread: Thread) -> Shown | None:
        """The gallery to show (None: no experiment has one). Raises NoAnswer."""
        try:
            summary = await self._call(thread, p.Summary(goal_id=thread.goal_id))
        except p.ProtocolError as exc:
            raise NoAnswer(exc.error.message) from exc
        best = summary.status.best
        for experiment in candidates(best, summary.ledger):
            png = await self._artifact(thread, experiment, GALLERY)
            if png is None or not png.startswith(_PNG_MAGIC):
                continue
            raw = await self._artifact(thread, experiment, ANALYSIS)
            is_best = best is not None and experiment.id == best.id
            return Shown(experiment, is_best, png, analysis_text(raw) if raw else "")
        return None

    def upload(self, thread: Thread, shown: Shown) -> Payload:
        """The upload payload for `shown` (the PNG written under plots_dir first)."""
        experiment = shown.experiment
        self.plots_dir.mkdir(parents=True, exist_ok=True)
        path = self.plots_dir / f"{thread.runner}-goal-{thread.goal_id}-exp-{experiment.index}-hard-cases.png"
        path.write_bytes(shown.png)
        which = "best experiment" if shown.best else "latest experiment with a gallery"
        comment = f"Hard cases of goal #{thread.goal_id}'s {which}, #{experiment.index}"
        if experiment.metric_name and experiment.metric_value is not None:
            comment += f" ({render.escape(experiment.metric_name)} {experiment.metric_value:.4g})"
        comment += ": truth→prediction per colour."
        if shown.analysis:
            comment += "\n" + shown.analysis
        title = f"Goal #{thread.goal_id}, experiment #{experiment.index}: hard cases"
        return {"file": str(path), "filename": path.name, "title": title, "initial_comment": comment}
