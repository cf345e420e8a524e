"""Asking people when the results carry little signal: a streak of new bests each within the noise
of the one before (GOALTENDER_NOISE_ASK_AFTER in a row), or a run whose training loss did not move
(runner/noise.py finds both). The question is an approval (runner/approvals.py); the answer, and
its comment, reach the agent's inbox. Asked once per streak, once per goal for a flat curve, never
while one such question of the goal is open.
"""

from __future__ import annotations

from goaltender.runner import noise
from goaltender.runner.approvals import Approvals
from goaltender.runner.config import RunnerSettings
from goaltender.runner.folding import Spawn
from goaltender.storage.records import Experiment, Goal
from goaltender.storage.runner_store import RunnerStore


class LowSignalPrompts:
    """Each goal's low-signal and flat-curve questions, asked after its runs."""

    def __init__(self, settings: RunnerSettings, store: RunnerStore, approvals: Approvals, spawn: Spawn):
        self.settings = settings
        self.store = store
        self.approvals = approvals
        self._spawn = spawn
        self._asking_low_signal: set[int] = set()  # goals with a low-signal prompt open
        self._asked_flat: set[int] = set()  # goals asked about a training curve that did not move

    async def after_run(self, goal: Goal, finished: Experiment, within_noise: bool) -> None:
        """A run entered in the ledger: a new best within noise may end a streak worth asking
        about; any other run that did not crash may have a flat curve."""
        if within_noise:
            await self._ask_when_low_signal(goal)
        elif finished.status != "crash":
            await self._ask_when_flat(goal, finished)

    async def _ask_when_flat(self, goal: Goal, experiment: Experiment) -> None:
        """A run whose training loss has not moved learned nothing to judge: the humans are asked
        how to go on (once a goal, and only with GOALTENDER_NOISE_ASK_AFTER set)."""
        if (
            not self.settings.noise_ask_after
            or goal.id in self._asked_flat
            or goal.id in self._asking_low_signal
        ):
            return
        found = noise.flat_curve(await self.store.loss_curves(goal.id, experiment.id))
        if found is None:
            return
        name, (start, end, points) = found
        self._asked_flat.add(goal.id)
        self._asking_low_signal.add(goal.id)
        question = (
            f"The training curve of #{experiment.index} has not moved ({name} {start:.4g} → "
            f"{end:.4g} over {points} points). Go on as planned?"
        )
        self._spawn(self._low_signal_prompt(goal, [], question))

    async def _ask_when_low_signal(self, goal: Goal) -> None:
        """After GOALTENDER_NOISE_ASK_AFTER kept results in a row within noise, ask the humans how
        to go on; their answer (and comment) reaches the agent's inbox. Asked once per streak."""
        wanted = self.settings.noise_ask_after
        kept = [e for e in await self.store.experiments(goal.id) if e.status == "keep"]
        streak = kept[-wanted:] if wanted else []
        if (
            len(streak) < wanted
            or not all(e.within_noise for e in streak)
            or goal.id in self._asking_low_signal
        ):
            return
        if any(e.within_noise for e in kept[-wanted - 1 : -wanted]) and len(kept) > wanted:
            return  # the streak was asked about when it reached this length
        self._asking_low_signal.add(goal.id)
        self._spawn(self._low_signal_prompt(goal, streak))

    async def _low_signal_prompt(self, goal: Goal, streak: list[Experiment], question: str = "") -> None:
        rows = ", ".join(
            f"#{e.index} {e.metric_value:.4g} ({e.interval_how}: {e.interval_low:.3g}–{e.interval_high:.3g})"
            for e in streak
            if e.metric_value is not None and e.interval_low is not None and e.interval_high is not None
        )
        question = question or f"The last {len(streak)} gains are within noise ({rows}). Go on as planned?"
        why = (
            "Each new best lies inside the noise of the one before it, so none is a finding yet. "
            if streak
            else "A run whose loss did not move is too small to learn from. "
        )
        detail = (
            why + "Options: repeat the best configs with other seeds (`--repeat 3`); a larger eval split; "
            "longer runs; or a change of direction. Approve to let the agent go on as planned, "
            "reject to have it change course; a comment reaches the agent either way."
        )
        try:
            approval = await self.approvals.ask(goal, "low_signal", question, detail, None)
            if approval.state in ("approved", "rejected"):
                verdict = "go on as planned" if approval.state == "approved" else "change course"
                comment = f": {approval.comment}" if approval.comment else ""
                await self.store.add_inbox(
                    goal.id,
                    approval.decided_by or "people",
                    f"{noise.LOW_SIGNAL_ANSWER} (#{approval.id}) the humans said: {verdict}{comment}. "
                    "Options were: repeat with other seeds (--repeat 3), a larger eval split, longer "
                    "runs, another direction.",
                )
        finally:
            self._asking_low_signal.discard(goal.id)
