"""The outbox against a fake Slack speaking the Web API: order, rate, Retry-After, no duplicates."""

from __future__ import annotations

import asyncio

import pytest
from fake_slack import FakeSlack
from helpers import eventually

from goaltender.bot.keys import CardKey
from goaltender.bot.outbox import METADATA_EVENT, Outbox, replacing
from goaltender.bot.slack_client import slack_session
from goaltender.storage.bot_store import BotStore


@pytest.fixture
async def slack():
    async with FakeSlack() as fake:
        fake.add_channel("C0TWO", "two")
        yield fake


CARD = CardKey("box", 1)  # the key a goal card is queued under


async def drain(outbox: Outbox, timeout: float = 30) -> None:
    """Make passes (as the outbox's own loop would) until everything queued is sent or failed."""

    async def sent_all() -> bool:
        await outbox.drain_once()
        return await outbox.idle()

    await eventually(sent_all, timeout)


async def test_posts_arrive_in_order_within_the_channel_rate(slack, tmp_path):
    slack.limit_channel_rate(0.9)  # Slack answers 429 to a channel written faster than this
    store = await BotStore.open(tmp_path / "bot.db")
    outbox = Outbox(store, slack.client())
    for i in range(4):
        await store.enqueue(slack.general, "post", {"text": f"general {i}"}, f"g{i}")
    for i in range(2):
        await store.enqueue("C0TWO", "post", {"text": f"two {i}"}, f"t{i}")
    await drain(outbox)
    assert [m.text for m in slack.messages(slack.general)] == [f"general {i}" for i in range(4)]
    assert [m.text for m in slack.messages("C0TWO")] == ["two 0", "two 1"]
    posts = slack.calls("chat.postMessage")
    assert all(call.ok for call in posts)  # never rate-limited: the outbox kept to one per second
    assert len(posts) == 6
    await store.close()


async def test_a_429_storm_delays_but_loses_and_reorders_nothing(slack, tmp_path):
    slack.rate_limit("chat.postMessage", times=3, retry_after=1)
    store = await BotStore.open(tmp_path / "bot.db")
    outbox = Outbox(store, slack.client(), per_channel_interval_s=0.1)
    for i in range(3):
        await store.enqueue(slack.general, "post", {"text": f"m{i}"}, f"k{i}")
    await drain(outbox)
    assert [m.text for m in slack.messages(slack.general)] == ["m0", "m1", "m2"]
    limited = [c for c in slack.calls("chat.postMessage") if c.status == 429]
    assert len(limited) == 3
    await store.close()


async def test_a_429_holds_its_channel_even_when_a_newer_edit_replaces_the_limited_one(slack, tmp_path):
    """A card edit gets a 429; a newer edit of the card replaces it while it waits, and a post is
    queued behind. Neither goes out before the Retry-After: Slack limited the channel, not a row."""
    store = await BotStore.open(tmp_path / "bot.db")
    outbox = Outbox(store, slack.client(), per_channel_interval_s=0.0)
    await store.enqueue(slack.general, "post", {"text": "card v0"}, str(CARD))
    await drain(outbox)
    slack.rate_limit("chat.update", times=1, retry_after=2)
    await store.enqueue(slack.general, "update", replacing(CARD, {"text": "card v1"}), "edit1")
    await outbox.drain_once()
    [limited] = slack.calls("chat.update")
    assert limited.status == 429
    await store.enqueue(slack.general, "update", replacing(CARD, {"text": "card v2"}), "edit2")
    await store.enqueue(slack.general, "post", {"text": "after"}, "after")
    await drain(outbox)
    later = [c for c in slack.calls() if c.time > limited.time]
    assert later and later[0].time - limited.time >= 2 - 0.05
    assert [m.text for m in slack.messages(slack.general)] == ["card v2", "after"]
    await store.close()


async def test_a_post_slack_took_before_a_crash_is_not_posted_again(slack, tmp_path):
    store = await BotStore.open(tmp_path / "bot.db")
    item_id = await store.enqueue(slack.general, "post", {"text": "milestone"}, "gpu1:7:0")
    # The bot sent it, Slack stored it, and the bot died before writing that down.
    await store.mark_attempt(item_id)
    slack.add_message(
        slack.general,
        "milestone",
        bot=True,
        metadata={"event_type": METADATA_EVENT, "event_payload": {"key": "gpu1:7:0"}},
    )
    outbox = Outbox(store, slack.client())
    await drain(outbox)
    assert [m.text for m in slack.messages(slack.general)] == ["milestone"]  # one, not two
    assert (await store.outbox_item(item_id)).state == "sent"
    await store.close()


async def test_updates_and_replies_wait_for_the_post_they_refer_to(slack, tmp_path):
    store = await BotStore.open(tmp_path / "bot.db")
    outbox = Outbox(store, slack.client(), per_channel_interval_s=0.05)
    await store.enqueue(slack.general, "post", {"text": "status card: running"}, "card")
    await store.enqueue(slack.general, "post", {"text": "milestone", "thread_of": "card"}, "m1")
    await store.enqueue(slack.general, "update", {"text": "status card: finished", "ts_of": "card"}, "card-2")
    await drain(outbox)
    [root] = slack.messages(slack.general)
    assert root.text == "status card: finished"
    assert [m.text for m in slack.thread(slack.general, root.ts)][-1] == "milestone"
    await store.close()


async def test_a_permanent_error_fails_the_item_and_says_so(slack, tmp_path):
    store = await BotStore.open(tmp_path / "bot.db")
    failures = []
    outbox = Outbox(store, slack.client())

    async def on_failed(item, error):
        failures.append((item.dedupe_key, error))

    outbox.on_failed = on_failed
    await store.enqueue("C0RANDOM", "post", {"text": "hello"}, "r1")  # the bot is not in #random
    await drain(outbox)
    assert failures == [("r1", "not_in_channel")]
    await store.close()


async def test_a_hung_call_holds_up_only_its_channel_which_keeps_its_order(slack, tmp_path):
    """Slack takes #general's post and never answers: #two's post goes out meanwhile (its own
    lane); #general's is tried again once the session's deadline ends the call, and its next post
    follows it, each once."""
    deadline = 5.0
    slack.hang("chat.postMessage", channel=slack.general)
    store = await BotStore.open(tmp_path / "bot.db")
    for i in range(2):
        await store.enqueue(slack.general, "post", {"text": f"general {i}"}, f"g{i}")
    await store.enqueue("C0TWO", "post", {"text": "two"}, "t0")
    async with slack_session(deadline) as session:
        outbox = Outbox(store, slack.client(session=session), per_channel_interval_s=0.0, backoff_s=0.05)
        task = asyncio.ensure_future(outbox.run())
        try:
            two = await slack.wait_for_message("C0TWO", text="two", timeout=30)
            [hung] = [c for c in slack.calls("chat.postMessage") if c.hung]
            [two_call] = [c for c in slack.calls("chat.postMessage") if c.ok and c.response["ts"] == two.ts]
            assert two_call.time - hung.time < deadline  # it did not wait for #general's call
            await slack.wait_for_message(slack.general, text="general 1", timeout=30)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await store.close()
    assert [m.text for m in slack.messages(slack.general)] == ["general 0", "general 1"]
    first_ok = next(
        c for c in slack.calls("chat.postMessage") if c.ok and c.params["channel"] == slack.general
    )
    assert first_ok.time - hung.time >= deadline - 0.5  # tried again after the deadline, not before
