"""Retention for bot.db: the delivered Slack writes and seen Slack event ids that nothing reads again.

Every write the bot makes stays in its outbox once sent (its key stops a replayed event from being
posted twice; its ts routes a reply, a reaction or a click to its goal). Past the retention period
(GOALTENDER_RETENTION_DAYS, default 90) a sent write is dropped, except
- each goal's card, the root of its thread: a reply in an old thread still finds its goal;
- the approval and budget prompts of goals that have not ended (a click on one still counts).
Slack's own event ids, kept to drop Slack's redeliveries (which come within minutes), go too.
Writes waiting or given up on, threads, milestones, channel settings and the audit trail stay.
A quarter of the file or more free afterwards is given back with VACUUM (storage/pruning.py).
"""

from __future__ import annotations

import json

from goaltender.bot.keys import ApprovalKey, BudgetKey, CardKey, parse
from goaltender.storage.bot_store import BotStore
from goaltender.storage.pruning import Pruned, cutoff_for, file_size, vacuum_if_worth_it
from goaltender.storage.records import TERMINAL_STATES

BATCH = 5_000  # rows deleted in one transaction


async def prune_bot(store: BotStore, days: int, *, dry_run: bool = False) -> Pruned:
    db = store.db
    pruned = Pruned(dry_run=dry_run, cutoff=cutoff_for(days), size_before=file_size(db.path))
    before = pruned.cutoff.isoformat()
    active = {
        (row[0], row[1])
        for row in await db.fetchall(
            "SELECT runner, goal_id FROM threads WHERE status IS NULL "
            "OR json_extract(status, '$.goal.state') NOT IN (SELECT value FROM json_each(?))",
            (_json_list(sorted(TERMINAL_STATES)),),
        )
    }
    rows = await db.fetchall(
        "SELECT id, dedupe_key FROM outbox WHERE state = 'sent' AND created_at < ? ORDER BY id", (before,)
    )
    doomed = [row[0] for row in rows if not _kept(row[1], active)]
    ended = await db.one(
        "SELECT COUNT(*) FROM threads WHERE json_extract(status, '$.goal.ended_at') < ?", (before,)
    )
    pruned.goals = int(ended[0])
    seen = await db.one("SELECT COUNT(*) FROM slack_events WHERE received_at < ?", (before,))
    pruned.rows = {"delivered post": len(doomed), "Slack event id": int(seen[0])}
    if not dry_run:
        for start in range(0, len(doomed), BATCH):
            chunk = doomed[start : start + BATCH]
            async with db.write() as tx:
                await tx.run(
                    "DELETE FROM outbox WHERE id IN (SELECT value FROM json_each(?))", (_json_list(chunk),)
                )
        async with db.write() as tx:
            await tx.run("DELETE FROM slack_events WHERE received_at < ?", (before,))
        if doomed or seen[0]:
            pruned.vacuumed = await vacuum_if_worth_it(db)
    pruned.size_after = file_size(db.path)
    return pruned


def _kept(key: str | None, active: set[tuple[str, int]]) -> bool:
    found = parse(key) if key else None
    if isinstance(found, CardKey):
        return True
    if isinstance(found, ApprovalKey | BudgetKey):
        return (found.runner, found.goal_id) in active
    return False


def _json_list(items: list) -> str:
    return json.dumps(items)
