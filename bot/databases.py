"""Which database each runner runs on, so that one database's goals never meet another's threads.

A runner's goal ids and event seqs are its database's: a runner started on another runner.db (a
fresh one, or another box given the same name) numbers its goals from #1 again, and the bot, which
keyed threads by (runner name, goal id), posted the new goal #1 into the old goal #1's thread. The
runner names its database in its welcome (`runner_id`, made with runner.db); the bot keeps under
a runner's name what belongs to the database it runs on now (threads, the event cursor, milestones,
budget requests, audit rows, outbox keys). When the runner comes back on another database, all
that is set aside under `<name>@<previous id>` (and what the bot had for the new one, if the runner
ran on it before, comes back), in one transaction of bot.db: the new database's goals get new
threads and its event log is read from the start. The old threads stay in Slack; their cards say
the goal is no longer on the runner, and a reply there is told so (RunnerPool names them).

A database restored from an earlier copy is the same database (same identity): its goals keep
their threads, and the runner numbers new goals and events above any it handed out before
(storage/high_water.py). A runner that numbers events again after a restore (an older one, or a
home restored whole) is followed from where its log ends (bot/links.py); what the bot kept for the
events after that point is set aside here, so that new events of those seqs are new to the bot.
"""

from __future__ import annotations

import logging

from goaltender.bot import keys, render
from goaltender.bot.keys import CardKey
from goaltender.bot.links import RETIRED
from goaltender.bot.outbox import Outbox, replacing
from goaltender.protocol import messages as p
from goaltender.storage.bot_store import BotStore, KeyMove
from goaltender.storage.records import utcnow

log = logging.getLogger("goaltender.bot")


def retired_name(runner: str, runner_id: str) -> str:
    """The name the bot keeps a database's goals under once `runner` runs on another."""
    return f"{runner}{RETIRED}{runner_id[:12]}"


class Databases:
    """What the bot does when a runner says which database it runs on, or rewinds its event log."""

    def __init__(self, store: BotStore, outbox: Outbox):
        self.store = store
        self.outbox = outbox

    async def on_database(self, runner: str, runner_id: str) -> None:
        previous = await self.store.switch_database(
            runner, runner_id, lambda each: retired_name(runner, each), keys.moved
        )
        if previous is None:
            return
        aside = retired_name(runner, previous)
        log.warning(
            "runner %s now runs on another database (%s; it ran on %s): its earlier goals' threads are kept as "
            "%s's, and its goals and events from now on get threads of their own",
            runner,
            runner_id,
            previous,
            aside,
        )
        await self._say_gone(runner, aside)

    async def _say_gone(self, runner: str, aside: str) -> None:
        """The cards of the active goals set aside say that their runner no longer has them."""
        for thread in await self.store.threads(runner=aside):
            last = p.GoalStatus.model_validate(thread.status) if thread.status else None
            if last is None or not last.goal.active:
                continue
            card = render.status_card(last, runner, runner_gone="it now runs on another database")
            await self.outbox.enqueue(
                thread.channel, "update", replacing(CardKey(aside, thread.goal_id), card)
            )

    async def on_rewind(self, runner: str, head: int) -> None:
        """The runner's event log ends before the bot's cursor (bot/links.py found it): read it again
        from its start, taking the events up to the last one read before for those (by their time),
        or, where that time is not known (bot.db from before it was kept), from `head`."""
        if await self.store.rewind(runner, head, lambda first: _aside(runner, first)):
            log.warning(
                "runner %s: reading its event log again from the start, the events read before it was restored "
                "skipped",
                runner,
            )


async def end_replay(store: BotStore, runner: str, first_new: int) -> None:
    """While a rewound log is read again (`Databases.on_rewind`), the first event newer than the
    last one read before is `first_new`: what the bot kept for that seq and later goes aside."""
    log.warning("runner %s: its events since its database was restored begin at seq %d", runner, first_new)
    await store.end_replay(runner, first_new, *_aside(runner, first_new))


def _aside(runner: str, first: int) -> tuple[str, KeyMove]:
    """Where what the bot kept for a runner's events from seq `first` on goes after a rewind."""
    aside = f"{runner}{RETIRED}rewound-{utcnow():%Y%m%dT%H%M%S}"
    return aside, keys.moved(runner, aside, events_after=first - 1)
