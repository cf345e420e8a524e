"""The bot's metrics for a monitoring system (GOALTENDER_BOT_METRICS_PORT; the endpoint is
runner/monitoring.py's): its links to the runners, the outbox of Slack writes (waiting, parked, how
long the oldest has waited), when Slack last took a write, and the goals waiting for a runner.
Read at each scrape from bot.db and the links themselves, as `/goal health` reads them."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from goaltender.runner.monitoring import LoopStateCollector, MetricsEndpoint
from goaltender.storage.records import utcnow

if TYPE_CHECKING:
    from goaltender.bot.app import GoaltenderBot


def bot_endpoint(bot: GoaltenderBot) -> MetricsEndpoint | None:
    """The bot's endpoint (None when GOALTENDER_BOT_METRICS_PORT is unset), not yet started."""
    settings = bot.settings
    if settings.bot_metrics_port is None:
        return None
    collector = LoopStateCollector(asyncio.get_running_loop(), lambda: bot_state(bot))
    return MetricsEndpoint(
        settings.bot_metrics_address, settings.bot_metrics_port, [collector], "GOALTENDER_BOT_METRICS_PORT"
    )


async def bot_state(bot: GoaltenderBot) -> list[Metric]:
    store = bot.store
    up = GaugeMetricFamily(
        "goaltender_bot_runner_up",
        "1 while the bot's link to this runner is connected and answering",
        labels=["runner"],
    )
    for link in bot.pool:
        up.add_metric([link.name], 1 if link.healthy else 0)
    pending, oldest = await store.pending_writes()
    families: list[Metric] = [
        up,
        GaugeMetricFamily(
            "goaltender_bot_outbox_pending",
            "Slack writes queued, not yet delivered",
            value=pending,
        ),
        GaugeMetricFamily(
            "goaltender_bot_outbox_parked",
            "Slack writes given up on (each left a note where it was going)",
            value=await store.failed_count(),
        ),
        GaugeMetricFamily(
            "goaltender_bot_outbox_oldest_pending_age_seconds",
            "How long the oldest Slack write still queued has waited (0: none waits)",
            value=(utcnow() - oldest).total_seconds() if oldest else 0.0,
        ),
        GaugeMetricFamily(
            "goaltender_bot_queued_goals",
            "Goals waiting for a runner to come back",
            value=await store.queued_goal_count(),
        ),
    ]
    if (sent := bot.outbox.last_sent_at) is not None:  # none yet since this process started: no sample
        families.append(
            GaugeMetricFamily(
                "goaltender_bot_last_slack_write_timestamp_seconds",
                "When Slack last took a write from this bot process (Unix time)",
                value=sent.timestamp(),
            )
        )
    return families
