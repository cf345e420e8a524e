"""Outbox keys: every kind reads back as itself whatever the runner is called (`queue`, `card`,
names with `:` or `%`), keys stored before they were typed read as they did, and a post's key
found from its (channel, ts) routes to the right goal card or approval prompt."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot.keys import (
    RUNNER_KEYS,
    ApprovalKey,
    BudgetKey,
    CardKey,
    DigestKey,
    EventKey,
    QueueKey,
    ReplyKey,
    moved,
    parse,
)
from goaltender.bot.outbox import Outbox
from goaltender.storage.bot_store import BotStore

AWKWARD = ["queue", "card", "approval", "reply", "digest", "plot", "a:b", "gpu1:5:card", "x:approval:3"]
AWKWARD += ["%", "%3A", "%253A", "100%:", ":", "::", "gpu 1", "5"]


def runner_keys(runner: str) -> list:
    return [
        CardKey(runner, 5),
        ApprovalKey(runner, 5, 2),
        BudgetKey(runner, 5, 2),
        EventKey(runner, 41, 0),
        EventKey(runner, 41, "plot"),
        EventKey(runner, 41, "card-update"),
    ]


@pytest.mark.parametrize("runner", AWKWARD)
def test_a_runner_with_any_name_has_keys_that_read_back_as_themselves(runner):
    keys = [*runner_keys(runner), QueueKey(5), ReplyKey("C0GENERAL", "1712345678.000100")]
    keys.append(DigestKey("C0GENERAL", datetime(2026, 12, 3, 9, 0, 0, 1234, tzinfo=UTC), plot=True))
    assert [parse(str(key)) for key in keys] == keys
    assert len({str(key) for key in keys}) == len(keys)  # no two kinds written alike


def test_keys_stored_before_they_were_typed_read_as_they_did():
    assert parse("gpu1:5:card") == CardKey("gpu1", 5)
    assert parse("gpu1:5:approval:2") == ApprovalKey("gpu1", 5, 2)
    assert parse("queue:3") == QueueKey(3)
    assert parse("gpu1:41:0") == EventKey("gpu1", 41, 0)
    assert parse("gpu1:41:card-update") == EventKey("gpu1", 41, "card-update")
    assert parse("reply:C0GENERAL:1712345678.000100") == ReplyKey("C0GENERAL", "1712345678.000100")
    # Never a card, a prompt or a queued goal, as before: an older digest, a bare pair, a test key.
    for other in ("digest:C0GENERAL:2026-12-03T09:00:00.001234+00:00", "gpu1:5", "card", ""):
        assert parse(other) is None


def any_key(st, names):
    """A hypothesis strategy for keys of every kind, runners named by `names`."""
    ids = st.integers(min_value=1, max_value=10**9)
    channels = st.from_regex(r"[CDG][A-Z0-9]{8,10}", fullmatch=True)
    tss = st.from_regex(r"[0-9]{10}\.[0-9]{6}", fullmatch=True)
    times = st.datetimes(datetime(2000, 1, 1), datetime(2200, 1, 1), timezones=st.just(UTC))
    return st.one_of(
        st.builds(CardKey, names, ids),
        st.builds(ApprovalKey, names, ids, ids),
        st.builds(BudgetKey, names, ids, ids),
        st.builds(QueueKey, ids),
        st.builds(
            EventKey, names, ids, st.one_of(st.integers(0, 9), st.sampled_from(["plot", "card-update"]))
        ),
        st.builds(ReplyKey, channels, tss),
        st.builds(DigestKey, channels, times, st.booleans()),
    )


def test_any_key_reads_back_as_itself():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.given(any_key(st, st.text(min_size=1, max_size=20)))
    def reads_back(key):
        assert parse(str(key)) == key

    reads_back()


def test_a_runner_s_keys_and_only_its_are_moved_under_another_name():
    """bot/databases.py sets a database's keys aside under `<name>@<id>`: every key of that
    runner (and of its events after a seq, when asked) is renamed, found by the prefix bot.db
    filters on, and no other key is touched, whatever the names."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    names = st.one_of(st.sampled_from(AWKWARD), st.text(min_size=1, max_size=12))

    @hypothesis.given(names, names, any_key(st, names), st.one_of(st.none(), st.integers(0, 10**9)))
    def moved_right(old, new, key, after):
        hypothesis.assume(old != new)
        move = moved(old, new, events_after=after)
        ours = isinstance(key, RUNNER_KEYS) and key.runner == old
        if after is not None:
            ours = ours and isinstance(key, EventKey) and key.seq > after
        assert move.rekey(str(key)) == (str(replace(key, runner=new)) if ours else None)
        if ours:
            assert str(key).startswith(move.prefix)

    moved_right()


@pytest.mark.parametrize("runner", ["queue", "card", "lab:gpu"])
async def test_the_post_at_a_channel_and_ts_is_found_by_its_key(tmp_path, runner):
    store = await BotStore.open(tmp_path / "bot.db")
    outbox = Outbox(store, AsyncWebClient())  # sends nothing here: the rows are marked sent by hand
    posts = {
        "1.000001": CardKey(runner, 3),
        "1.000002": ApprovalKey(runner, 3, 7),
        "1.000003": QueueKey(3),
        "1.000004": BudgetKey(runner, 3, 1),
    }
    for ts, key in posts.items():
        item_id = await store.enqueue("C1", "post", {"text": ts}, str(key))
        await store.mark_sent(item_id, {"ts": ts})
    assert {ts: await outbox.posted_at("C1", ts) for ts in posts} == posts
    assert await outbox.posted_at("C1", "9.000000") is None
    await store.close()
