"""The soak test's agent: a goal's worth of events as fast as its socket takes them.

It logs the metric `soak` at steps 0, 1, 2, … (one request, so one event, per step) and every
MILESTONE_EVERY steps a milestone, until TOTAL steps; then its report. Killed with its runner, it
is restarted by the runner's recovery and resumes after the last step the runner stored (asked
through GetSeries), so each step is in the log once, whatever was lost in flight.

    python soak_agent.py TOTAL MILESTONE_EVERY
"""

from __future__ import annotations

import asyncio
import os
import sys

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient, socket_from_env


async def main(total: int, milestone_every: int) -> None:
    goal_id = int(os.environ["GOALTENDER_GOAL_ID"])
    async with await RunnerClient.connect_unix(socket_from_env(), client="soak-agent") as runner:
        series = await runner.request(p.GetSeries(goal_id=goal_id, name="soak"))
        resume = 1 + max((int(s) for s, _ in series.points if s is not None), default=-1)
        for step in range(resume, total):
            point = p.MetricPoint(name="soak", value=float(step % 97), step=step)
            await runner.request(p.LogMetrics(goal_id=goal_id, points=[point]))
            if step % milestone_every == milestone_every - 1:
                await runner.request(p.ReportMilestone(goal_id=goal_id, title=f"soak step {step}"))
        await runner.request(p.SubmitReport(goal_id=goal_id, text=f"soak done: {total} steps"))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
