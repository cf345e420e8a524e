"""bot.db: event cursors and outbox rows move together; Slack event ids are seen once."""

from __future__ import annotations

from datetime import UTC, datetime

from goaltender.bot.keys import CardKey, moved
from goaltender.bot.outbox import in_thread
from goaltender.storage.bot_store import BotStore


async def test_an_event_is_recorded_once_with_its_writes(tmp_path):
    store = await BotStore.open(tmp_path / "bot.db")
    writes = [("C1", "post", {"text": "milestone"}, "gpu1:5:0")]
    assert await store.record_event("gpu1", 5, writes)
    assert not await store.record_event("gpu1", 5, writes)  # redelivered after a reconnect
    assert not await store.record_event("gpu1", 4, [("C1", "post", {"text": "old"}, "gpu1:4:0")])
    assert await store.cursor("gpu1") == 5 and await store.cursor("gpu2") == 0
    [item] = await store.next_pending(now=1e12)
    assert item.payload == {"text": "milestone"} and item.dedupe_key == "gpu1:5:0"
    await store.close()


async def test_outbox_keeps_order_per_channel_and_waits_for_retry_after(tmp_path):
    store = await BotStore.open(tmp_path / "bot.db")
    a1 = await store.enqueue("C1", "post", {"text": "a1"}, "k1")
    await store.enqueue("C1", "post", {"text": "a2"}, "k2")
    b1 = await store.enqueue("C2", "post", {"text": "b1"}, "k3")
    assert await store.enqueue("C1", "post", {"text": "again"}, "k1") is None  # same key: queued once
    heads = await store.next_pending(now=100)
    assert [(i.channel, i.id) for i in heads] == [("C1", a1), ("C2", b1)]  # one head per channel
    await store.mark_retry(a1, not_before=200, error="ratelimited")
    assert [i.id for i in await store.next_pending(now=150)] == [b1]  # C1 waits; its a2 does not jump ahead
    await store.mark_sent(a1, {"ts": "1.000100"})
    assert [i.payload["text"] for i in await store.next_pending(now=150)] == ["a2", "b1"]
    assert (await store.outbox_by_key("k1")).result == {"ts": "1.000100"}
    await store.close()


async def test_slack_event_ids_are_seen_once(tmp_path):
    store = await BotStore.open(tmp_path / "bot.db")
    assert await store.first_sight("Ev1")
    assert not await store.first_sight("Ev1")
    await store.close()
    reopened = await BotStore.open(tmp_path / "bot.db")  # survives a restart
    assert not await reopened.first_sight("Ev1")
    await reopened.close()


async def test_budget_requests_are_decided_once_and_their_prompt_queued_with_them(tmp_path):
    store = await BotStore.open(tmp_path / "bot.db")
    thread = await store.add_thread("gpu1", 5, "C1", "U0ALICE")
    request = await store.add_budget_request(
        thread,
        "budget +5h",
        "adds 5h00m of time",
        "U0ALICE",
        lambda rid: ({"text": f"#{rid}"}, f"gpu1:5:budget:{rid}"),
    )
    assert (await store.outbox_by_key(f"gpu1:5:budget:{request.id}")).payload == {"text": f"#{request.id}"}
    assert [r.id for r in await store.budget_requests(runner="gpu1", goal_id=5)] == [request.id]
    decided, first = await store.decide_budget_request(request.id, "approved", "U0CAROL")
    assert decided.state == "approved"
    again, second = await store.decide_budget_request(request.id, "rejected", "U0DAN")
    assert first and not second and again.state == "approved" and again.decided_by == "U0CAROL"
    # The runner was unreachable: pending again, for anyone to decide.
    reopened = await store.unapply_budget_request(request.id)
    assert (reopened.state, reopened.decided_by) == ("pending", None)
    await store.decide_budget_request(request.id, "approved", "U0DAN")
    failed = await store.unapply_budget_request(request.id, "goal #5 has ended")
    assert (failed.state, failed.decided_by, failed.error) == ("failed", "U0DAN", "goal #5 has ended")
    await store.close()


async def test_channel_settings_and_milestones(tmp_path):
    store = await BotStore.open(tmp_path / "bot.db")
    await store.set_channel_setting("C1", "approvers", {"everyone": False, "users": ["U1"]}, "U0ADMIN")
    assert (await store.channel_setting("C1", "approvers")).value == {"everyone": False, "users": ["U1"]}
    assert (
        list(await store.channel_settings("C1")) == ["approvers"] and await store.channel_settings("C2") == {}
    )
    await store.set_channel_setting("C1", "approvers", None, "U0ADMIN")  # back to the configuration
    assert await store.channel_setting("C1", "approvers") is None
    await store.add_thread("gpu1", 5, "C1", "U0ALICE")
    for seq, title in [(3, "Plan"), (3, "Plan"), (9, "Baseline")]:  # an event rendered twice: one row
        await store.set_milestone("gpu1", 5, title, seq)
    assert [(m.seq, m.title) for m in await store.milestones("gpu1", 5)] == [(3, "Plan"), (9, "Baseline")]
    assert [m.title for m in await store.milestones("gpu1", 5, last=1)] == ["Baseline"]
    assert (await store.thread("gpu1", 5)).milestone == "Baseline"
    await store.close()


async def test_a_runner_on_another_database_has_its_goals_set_aside_and_back(tmp_path):
    """bot/databases.py: what is kept under a runner's name belongs to the database it runs on."""
    store = await BotStore.open(tmp_path / "bot.db")
    aside = {"a" * 32: "gpu1@aaaaaaaaaaaa", "b" * 32: "gpu1@bbbbbbbbbbbb"}

    async def switch(runner_id: str) -> str | None:
        return await store.switch_database("gpu1", runner_id, aside.__getitem__, moved)

    assert await switch("a" * 32) is None  # the first one seen takes over what is stored
    card = str(CardKey("gpu1", 1))
    await store.add_thread("gpu1", 1, "C1", "U1", card=({"text": "card"}, card))
    await store.record_event(
        "gpu1", 7, [("C1", "post", in_thread(CardKey("gpu1", 1), {"text": "m"}), "gpu1:7:0")]
    )
    assert await switch("a" * 32) is None  # the same database: nothing moves

    assert await switch("b" * 32) == "a" * 32
    assert await store.thread("gpu1", 1) is None and await store.cursor("gpu1") == 0
    assert (await store.thread("gpu1@aaaaaaaaaaaa", 1)).channel == "C1"
    pending = await store.outbox_by_key("gpu1@aaaaaaaaaaaa:7:0")
    assert pending.payload["thread_of"] == "gpu1@aaaaaaaaaaaa:1:card"  # still finds its card
    assert await store.outbox_by_key(card) is None  # free for the new database's goal #1

    assert await switch("a" * 32) == "b" * 32  # back on the first: its goals come back
    assert (await store.thread("gpu1", 1)).channel == "C1" and await store.cursor("gpu1") == 7
    assert (await store.outbox_by_key("gpu1:7:0")).payload["thread_of"] == card
    assert await store.runner_id("gpu1") == "a" * 32
    await store.close()


async def test_a_rewound_log_is_read_again_from_the_start_or_its_end(tmp_path):
    """A runner's log found to end before the cursor: read again from the start, the events up to
    the time of the last one read skipped (bot/thread.py), or, with that time unknown (a cursor
    from before it was kept), from the log's end, what was kept for later seqs set aside."""
    store = await BotStore.open(tmp_path / "bot.db")
    read_at = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    await store.record_event("timed", 9, [("C1", "post", {"text": "m"}, "timed:9:0")], read_at)
    assert await store.rewind(
        "timed", 4, lambda first: ("timed@x", moved("timed", "timed@x", events_after=first - 1))
    )
    assert await store.position("timed") == (0, read_at)
    await store.end_replay("timed", 6, "timed@x", moved("timed", "timed@x", events_after=5))
    assert await store.position("timed") == (0, None) and await store.outbox_by_key("timed@x:9:0")

    await store.record_event("old", 9, [("C1", "post", {"text": "m"}, "old:9:0")])  # no time kept
    await store.set_milestone("old", 1, "later", seq=9)
    assert not await store.rewind(
        "old", 4, lambda first: ("old@x", moved("old", "old@x", events_after=first - 1))
    )
    assert await store.position("old") == (4, None)
    assert await store.outbox_by_key("old@x:9:0") and await store.milestones("old", 1) == []
    await store.close()
