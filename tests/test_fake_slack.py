"""The fake Slack speaks the wire protocol the real slack_bolt AsyncApp + AsyncSocketModeHandler and
the real slack_sdk AsyncWebClient expect: these tests run them, unmodified, against it."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from fake_slack import ALICE, BOB, FakeSlack
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

APPROVAL_BLOCKS = [
    {"type": "section", "text": {"type": "mrkdwn", "text": "*Run 3 more sweeps?* (2 GPU-hours)"}},
    {
        "type": "actions",
        "block_id": "approval",
        "elements": [
            {
                "type": "button",
                "action_id": "approve",
                "text": {"type": "plain_text", "text": "Approve"},
                "style": "primary",
                "value": "appr-7",
            },
            {
                "type": "button",
                "action_id": "reject",
                "text": {"type": "plain_text", "text": "Reject"},
                "style": "danger",
                "value": "appr-7",
            },
        ],
    },
]


@pytest.fixture
async def fake():
    async with FakeSlack() as server:
        yield server


@dataclass
class Bot:
    app: AsyncApp
    handler: AsyncSocketModeHandler
    client: AsyncWebClient
    seen: dict[str, list] = field(default_factory=lambda: defaultdict(list))


def build_app(fake: FakeSlack, seen: dict[str, list]) -> tuple[AsyncApp, AsyncWebClient]:
    client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
    client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=2))
    app = AsyncApp(client=client)

    @app.middleware
    async def record_retries(req, next):
        seen["retry_num"].append(req.headers.get("x-slack-retry-num", ["0"])[0])
        return await next()

    @app.command("/goal")
    async def goal(ack, respond, command, client):
        await ack()
        await respond(f"queued: {command['text']}")
        await client.chat_postMessage(
            channel=command["channel_id"],
            text=f"Goal: {command['text']}",
            metadata={"event_type": "goal_created", "event_payload": {"goal_id": "g1"}},
        )

    @app.event("message")
    async def on_message(event):
        seen["message"].append(event)

    @app.event("app_mention")
    async def on_mention(event):
        seen["app_mention"].append(event)

    @app.event("reaction_added")
    async def on_reaction(event):
        seen["reaction_added"].append(event)

    @app.action("approve")
    async def approve(ack, body, client):
        await ack()
        seen["action"].append(body)
        await client.chat_update(
            channel=body["container"]["channel_id"],
            ts=body["container"]["message_ts"],
            text=f"Approved by <@{body['user']['id']}>",
            blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": "Approved :white_check_mark:"}}],
        )

    return app, client


@pytest.fixture
async def bot(fake):
    seen: dict[str, list] = defaultdict(list)
    app, client = build_app(fake, seen)
    handler = AsyncSocketModeHandler(app, app_token=fake.app_token, web_client=client)
    await handler.connect_async()
    await fake.wait_connected()
    yield Bot(app, handler, client, seen)
    await handler.close_async()


async def test_slash_command_acks_responds_ephemerally_and_posts(fake, bot):
    res = await fake.slash_command("/goal", "reach 80% on cifar", channel=fake.general, user=ALICE)
    assert res.acked and res.envelope.ack_latency < 3
    eph = await res.wait_for_ephemeral()
    assert (eph.text, eph.user, eph.source) == ("queued: reach 80% on cifar", ALICE, "response_url")
    assert res.responses == [{"text": "queued: reach 80% on cifar"}]

    posted = await fake.wait_for_message(fake.general, text="Goal: reach 80% on cifar")
    assert posted.bot_id == fake.bot_id and posted.user == fake.bot_user_id
    assert posted.metadata == {"event_type": "goal_created", "event_payload": {"goal_id": "g1"}}
    assert posted.ts > "1700000000.000000" and len(posted.ts.split(".")[1]) == 6

    # Slack sends the bot its own post back as a message event; Bolt acks and drops it.
    echo = await fake.wait_for(
        lambda: [e for e in fake.envelopes if e.event and e.event.get("bot_id") == fake.bot_id and e.acked]
    )
    assert echo[0].event["ts"] == posted.ts
    assert bot.seen["message"] == []
    assert [c.method for c in fake.calls() if c.method != "response_url"] == [
        "apps.connections.open",
        "auth.test",
        "chat.postMessage",
    ]


async def test_thread_reply_reaches_listener_with_event_fields(fake, bot):
    root = await fake.user_posts(fake.general, "train a resnet")
    reply = await fake.user_replies(fake.general, root.ts, "actually, stop", user=BOB)
    events = await fake.wait_for(lambda: [e for e in bot.seen["message"] if e["ts"] == reply.ts])
    event = events[0]
    assert event["thread_ts"] == root.ts and event["parent_user_id"] == ALICE
    assert (event["user"], event["text"], event["channel"], event["channel_type"]) == (
        BOB,
        "actually, stop",
        fake.general,
        "channel",
    )
    assert event["event_ts"] == reply.ts
    body = reply.envelopes[0].payload
    assert body["event_id"].startswith("Ev") and isinstance(body["event_time"], int)
    assert (body["team_id"], body["api_app_id"], body["type"]) == (
        fake.team_id,
        fake.api_app_id,
        "event_callback",
    )
    assert [m.ts for m in fake.thread(fake.general, root.ts)] == [root.ts, reply.ts]
    assert fake.messages(fake.general) == [root]


async def test_other_bots_messages_are_not_ignored(fake, bot):
    # A runner posting with its own token: IgnoringSelfEvents only drops *our* bot_id.
    msg = await fake.bot_posts(fake.general, "run 12 finished", bot_id="B0RUNNER", user="U0RUNNER")
    events = await fake.wait_for(lambda: bot.seen["message"])
    assert (events[0]["ts"], events[0]["bot_id"], events[0]["user"]) == (msg.ts, "B0RUNNER", "U0RUNNER")


async def test_mention_arrives_as_app_mention_and_message(fake, bot):
    msg = await fake.user_mentions_bot(fake.general, "what's the status?")
    assert msg.text == f"<@{fake.bot_user_id}> what's the status?"
    await fake.wait_for(lambda: bot.seen["app_mention"] and bot.seen["message"])
    mention, message = bot.seen["app_mention"][0], bot.seen["message"][0]
    assert mention["ts"] == message["ts"] == msg.ts
    assert [e.event_type for e in msg.envelopes] == ["app_mention", "message"]
    assert msg.envelopes[0].event_id != msg.envelopes[1].event_id
    assert message["blocks"][0]["elements"][0]["elements"][0] == {"type": "user", "user_id": fake.bot_user_id}


async def test_reaction_with_skin_tone_arrives(fake, bot):
    posted = await bot.client.chat_postMessage(channel=fake.general, text="Approve the sweep?")
    await fake.user_reacts(fake.general, posted["ts"], "+1::skin-tone-3", user=BOB)
    events = await fake.wait_for(lambda: bot.seen["reaction_added"])
    assert events[0]["reaction"] == "+1::skin-tone-3"
    assert events[0]["item"] == {"type": "message", "channel": fake.general, "ts": posted["ts"]}
    assert (events[0]["user"], events[0]["item_user"]) == (BOB, fake.bot_user_id)
    # The bot's own reaction comes back as an event too, and Bolt drops it.
    await bot.client.reactions_add(channel=fake.general, timestamp=posted["ts"], name="eyes")
    with pytest.raises(SlackApiError) as err:
        await bot.client.reactions_add(channel=fake.general, timestamp=posted["ts"], name="eyes")
    assert err.value.response["error"] == "already_reacted"
    assert fake.message(fake.general, posted["ts"]).reactions == {
        "+1::skin-tone-3": [BOB],
        "eyes": [fake.bot_user_id],
    }
    await fake.wait_for(lambda: all(e.acked for e in fake.envelopes if e.event_type == "reaction_added"))
    assert len(bot.seen["reaction_added"]) == 1


async def test_button_click_arrives_and_chat_update_changes_the_message(fake, bot):
    root = await bot.client.chat_postMessage(channel=fake.general, text="Goal g1")
    posted = await bot.client.chat_postMessage(
        channel=fake.general, thread_ts=root["ts"], text="Approval needed", blocks=APPROVAL_BLOCKS
    )
    click = await fake.click_button(fake.general, posted["ts"], "approve", user=BOB)
    assert click.acked
    msg = await fake.wait_for_message(fake.general, thread_ts=root["ts"], text="Approved by")
    assert msg.ts == posted["ts"] and msg.edited and msg.action_ids() == []
    body = bot.seen["action"][0]
    assert body["actions"][0]["value"] == "appr-7" and body["actions"][0]["block_id"] == "approval"
    assert body["container"] == {
        "type": "message",
        "message_ts": posted["ts"],
        "channel_id": fake.general,
        "is_ephemeral": False,
        "thread_ts": root["ts"],
    }
    assert body["message"]["blocks"][1]["elements"][0]["action_id"] == "approve"
    assert body["response_url"].startswith(fake.url) and body["trigger_id"]
    with pytest.raises(ValueError, match="no element with action_id"):
        await fake.click_button(fake.general, posted["ts"], "approve")


async def test_files_upload_v2_into_a_thread_creates_a_file_message(fake, bot):
    root = await bot.client.chat_postMessage(channel=fake.general, text="Goal g1")
    png = b"\x89PNG\r\n\x1a\nfake-plot"
    resp = await bot.client.files_upload_v2(
        channel=fake.general,
        thread_ts=root["ts"],
        file=png,
        filename="loss.png",
        title="Loss curve",
        initial_comment="epoch 3: loss 0.41",
    )
    file_id = resp["file"]["id"]
    assert "ts" not in resp  # as with Slack: no message ts in the answer
    [msg] = fake.messages(fake.general, thread_ts=root["ts"])
    assert msg.text == "epoch 3: loss 0.41" and msg.bot_id == fake.bot_id
    assert [(f["id"], f["name"], f["title"], f["mimetype"]) for f in msg.files] == [
        (file_id, "loss.png", "Loss curve", "image/png")
    ]
    assert fake.files[file_id].content == png
    assert [c.method for c in fake.calls()][-3:] == [
        "files.getUploadURLExternal",
        "upload",
        "files.completeUploadExternal",
    ]
    info = await bot.client.files_info(file=file_id)
    assert info["file"]["shares"]["public"][fake.general][0]["ts"] == msg.ts
    # Once shared, the file can be referenced from an image block.
    ok = await bot.client.chat_postMessage(
        channel=fake.general,
        text="plot",
        blocks=[{"type": "image", "slack_file": {"id": file_id}, "alt_text": "loss"}],
    )
    assert ok["ok"]


async def api_error(call) -> str:
    with pytest.raises(SlackApiError) as err:
        await call
    return err.value.response["error"]


async def test_realistic_errors(fake):
    client = fake.client()
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "x"}}
    assert await api_error(
        client.chat_postMessage(channel=fake.general, text="t", blocks=[section] * 51)
    ) == ("invalid_blocks")
    long_section = {"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel=fake.general, text="t", blocks=[long_section])
    assert err.value.response["error"] == "invalid_blocks"
    assert err.value.response["errors"] == [
        "must be less than 3001 characters [json-pointer:/blocks/0/text/text]"
    ]
    assert await api_error(
        client.chat_postMessage(channel=fake.general, text="t", blocks=[{"type": "section"}])
    ) == ("invalid_blocks")
    assert await api_error(client.chat_postMessage(channel=fake.general, text="x" * 40_001)) == "msg_too_long"
    assert await api_error(client.chat_postMessage(channel="C0RANDOM", text="hi")) == "not_in_channel"
    assert await api_error(client.chat_postMessage(channel="C0NOPE", text="hi")) == "channel_not_found"
    with pytest.warns(UserWarning, match="text"):  # slack_sdk warns client-side too
        assert await api_error(client.chat_postMessage(channel=fake.general, text="")) == "no_text"
    assert await api_error(client.chat_postMessage(channel=fake.general, text="t", thread_ts="0")) == (
        "invalid_thread_ts"
    )
    bad_token = AsyncWebClient(token="xoxb-stolen", base_url=fake.api_url)
    assert await api_error(bad_token.chat_postMessage(channel=fake.general, text="hi")) == "invalid_auth"
    assert await api_error(client.apps_connections_open(app_token=fake.bot_token)) == "not_allowed_token_type"
    user_msg = await fake.user_posts(fake.general, "mine")
    assert await api_error(client.chat_update(channel=fake.general, ts=user_msg.ts, text="edited")) == (
        "cant_update_message"
    )
    assert (
        await api_error(client.chat_update(channel=fake.general, ts="1.000001", text="x"))
        == "message_not_found"
    )
    # Nothing was stored by the failed calls, and every call was recorded.
    assert fake.messages(fake.general) == [user_msg]
    assert len(fake.calls("chat.postMessage")) == 9
    # Form-encoded bodies work too (blocks as a JSON string), and calls record them decoded.
    form = await client.api_call(
        "chat.postMessage", data={"channel": fake.general, "text": "form", "blocks": json.dumps([section])}
    )
    assert form["message"]["blocks"][0]["text"]["text"] == "x"
    assert fake.calls("chat.postMessage")[-1].params["blocks"] == [section]


async def test_ratelimited_429_is_retried_after_retry_after(fake):
    client = fake.client()
    client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=2))
    fake.rate_limit(method="chat.postMessage", times=1, retry_after=1)
    resp = await client.chat_postMessage(channel=fake.general, text="milestone 1")
    assert resp["ok"]
    first, second = fake.calls("chat.postMessage")
    assert (first.status, first.error, first.headers["Retry-After"]) == (429, "ratelimited", "1")
    assert second.ok and second.time - first.time >= 1.0
    assert [m.text for m in fake.messages(fake.general)] == ["milestone 1"]


async def test_enforced_per_channel_rate(fake):
    fake.add_channel("C0OTHER", "other")
    fake.limit_channel_rate(1.0)
    client = fake.client()
    await client.chat_postMessage(channel=fake.general, text="one")
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel=fake.general, text="two")
    assert err.value.response.status_code == 429 and err.value.response.headers["Retry-After"] == "1"
    assert (await client.chat_postMessage(channel="C0OTHER", text="elsewhere"))["ok"]
    fake.limit_channel_rate(None)
    assert (await client.chat_postMessage(channel=fake.general, text="two"))["ok"]


async def test_unacked_envelope_is_redelivered_with_retry_attempt(fake):
    fake.ack_timeout, fake.retry_delays, fake.max_retries = 0.3, (0.0,), 1
    app = AsyncApp(client=fake.client())

    @app.event("message")  # no reaction_added listener: Bolt answers 404 and never acks it
    async def on_message(event):
        pass

    handler = AsyncSocketModeHandler(app, app_token=fake.app_token)
    await handler.connect_async()
    try:
        msg = await fake.user_posts(fake.general, "react to me")
        await msg.envelopes[0].wait_acked()
        first = await fake.user_reacts(fake.general, msg.ts, "eyes")
        await fake.wait_for(lambda: first.redelivered_as is not None, timeout=3)
        again = first.redelivered_as
        assert (again.retry_attempt, again.retry_reason) == (1, "timeout")
        assert again.event_id == first.event_id and again.envelope_id != first.envelope_id
        await fake.wait_for(lambda: again.timed_out, timeout=3)
        assert again.redelivered_as is None  # max_retries reached
        assert not first.acked
    finally:
        await handler.close_async()


async def test_redelivery_keeps_event_id_and_bolt_sees_retry_header(fake, bot):
    msg = await fake.user_posts(fake.general, "start goal")
    await msg.envelopes[0].wait_acked()
    again = await fake.redeliver(msg.envelopes[0])
    await again.wait_acked()
    await fake.wait_for(lambda: len(bot.seen["message"]) == 2)
    assert [e["ts"] for e in bot.seen["message"]] == [msg.ts, msg.ts]
    assert again.payload["event_id"] == msg.envelopes[0].payload["event_id"]
    assert bot.seen["retry_num"][-1] == "1"


async def test_disconnect_then_reconnect_and_events_still_arrive(fake, bot):
    assert len(fake.calls("apps.connections.open")) == 1
    assert await fake.disconnect() == 1
    msg = await fake.user_posts(fake.general, "are you there?")
    await fake.wait_connected(2)
    await fake.wait_for(lambda: [e for e in bot.seen["message"] if e["ts"] == msg.ts])
    assert len(fake.calls("apps.connections.open")) == 2
    assert msg.envelopes[0].connection == 2
    assert fake.connections[0].frames[-1]["type"] == "disconnect"


async def test_dropped_socket_is_noticed_and_reconnected(fake):
    seen: dict[str, list] = defaultdict(list)
    app, client = build_app(fake, seen)
    handler = AsyncSocketModeHandler(app, app_token=fake.app_token, web_client=client, ping_interval=0.3)
    await handler.connect_async()
    try:
        await fake.wait_connected()
        await fake.disconnect(drop=True)
        msg = await fake.user_posts(fake.general, "still there?")
        await fake.wait_connected(2, timeout=5)
        await fake.wait_for(lambda: [e for e in seen["message"] if e["ts"] == msg.ts])
    finally:
        await handler.close_async()


async def test_unacked_slash_command_shows_operation_timeout(fake, bot):
    fake.ack_timeout = 0.3
    res = await fake.slash_command("/unknown", "x", user=BOB)  # no listener: Bolt never acks
    assert not res.acked and res.timed_out
    eph = await res.wait_for_ephemeral()
    assert eph.text == '/unknown failed with the error "operation_timeout"' and eph.source == "slack"


async def test_bot_not_in_channel_hears_nothing_until_invited(fake, bot):
    before = await fake.user_posts("#random", "anyone?")
    assert before.envelopes == []
    await fake.invite_bot("random", by=ALICE)
    assert (await bot.client.chat_postMessage(channel="C0RANDOM", text="hello"))["ok"]
    after = await fake.user_posts("C0RANDOM", "welcome")
    await fake.wait_for(lambda: [e for e in bot.seen["message"] if e["ts"] == after.ts])


async def test_history_and_replies_return_metadata_for_crash_dedupe(fake):
    client = fake.client()
    root = await client.chat_postMessage(channel=fake.general, text="Goal g1")
    for i in range(3):
        await client.chat_postMessage(
            channel=fake.general,
            thread_ts=root["ts"],
            text=f"milestone {i}",
            metadata={"event_type": "goaltender_write", "event_payload": {"key": f"m{i}"}},
        )
    replies = await client.conversations_replies(
        channel=fake.general, ts=root["ts"], include_all_metadata=True
    )
    msgs = replies["messages"]
    assert msgs[0]["reply_count"] == 3 and msgs[0]["thread_ts"] == root["ts"]
    assert [m.get("metadata", {}).get("event_payload") for m in msgs[1:]] == [
        {"key": f"m{i}"} for i in range(3)
    ]
    plain = await client.conversations_replies(channel=fake.general, ts=root["ts"])
    assert all("metadata" not in m for m in plain["messages"])
    page = await client.conversations_replies(channel=fake.general, ts=root["ts"], limit=2)
    assert page["has_more"] and len(page["messages"]) == 2
    rest = await client.conversations_replies(
        channel=fake.general, ts=root["ts"], limit=2, cursor=page["response_metadata"]["next_cursor"]
    )
    assert [m["text"] for m in rest["messages"]] == ["milestone 1", "milestone 2"]
    history = await client.conversations_history(channel=fake.general, include_all_metadata=True)
    assert [m["text"] for m in history["messages"]] == ["Goal g1"]
    user = await client.users_info(user=ALICE)
    assert user["user"]["name"] == "alice" and not user["user"]["is_bot"]
    assert await api_error(client.conversations_history(channel="C0RANDOM")) == "not_in_channel"


async def test_response_url_replace_original_and_ephemeral(fake, bot):
    @bot.app.action("reject")
    async def reject(ack, respond):
        await ack()
        await respond(text="Rejected", replace_original=True)
        await respond(text="noted, the sweep will not run")  # no replace_original: only the clicker sees it

    posted = await bot.client.chat_postMessage(channel=fake.general, text="Approval", blocks=APPROVAL_BLOCKS)
    click = await fake.click_button(fake.general, posted["ts"], "reject", user=ALICE)
    await click.wait_for_response(2)
    msg = fake.message(fake.general, posted["ts"])
    assert msg.text == "Rejected" and msg.blocks is None and msg.edited
    assert [(e.text, e.user) for e in click.ephemerals] == [("noted, the sweep will not run", ALICE)]
    assert "Rejected" in fake.transcript(fake.general)


async def test_ack_text_and_post_ephemeral_reach_only_the_user(fake, bot):
    @bot.app.command("/status")
    async def status(ack, command, client):
        await ack("checking…")
        await client.chat_postEphemeral(
            channel=command["channel_id"], user=command["user_id"], text="all good"
        )

    res = await fake.slash_command("/status", "", fake.general, BOB)
    assert res.ack_payload == {"text": "checking…"}
    await res.wait_for_ephemeral(2)
    # Bolt sends the ack frame when its 10 ms poll sees ack() was called, so work done right after
    # `await ack()` can reach Slack first: the order of these two is not fixed.
    assert sorted((e.text, e.source) for e in res.ephemerals) == [
        ("all good", "chat.postEphemeral"),
        ("checking…", "ack"),
    ]
    assert fake.ephemerals(ALICE) == [] and fake.messages(fake.general) == []
    with pytest.raises(SlackApiError) as err:
        await bot.client.chat_postEphemeral(channel=fake.general, user="U0STRANGER", text="hi")
    assert err.value.response["error"] == "user_not_found"


async def test_home_tab_opened_and_published_with_slacks_checks(fake, bot):
    @bot.app.event("app_home_opened")
    async def home(event, client):
        bot.seen["home"].append(event)
        await client.views_publish(
            user_id=event["user"],
            view={"type": "home", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}]},
        )

    await fake.user_opens_home(BOB)
    await fake.wait_for(lambda: BOB in fake.home_views)
    first = fake.home_views[BOB]
    assert first["type"] == "home" and first["blocks"][0]["block_id"]
    assert bot.seen["home"][0]["tab"] == "home" and "view" not in bot.seen["home"][0]
    # Opened again: the event carries the view published before; publishing keeps its id.
    await fake.user_opens_home(BOB)
    await fake.wait_for(lambda: len(bot.seen["home"]) == 2 and fake.home_views[BOB] is not first)
    assert bot.seen["home"][1]["view"]["id"] == first["id"] == fake.home_views[BOB]["id"]

    section = {"type": "section", "text": {"type": "mrkdwn", "text": "x"}}
    too_many = {"type": "home", "blocks": [section] * 101}
    with pytest.raises(SlackApiError) as err:
        await bot.client.views_publish(user_id=ALICE, view=too_many)
    assert err.value.response["error"] == "invalid_arguments"
    assert "[json-pointer:/view/blocks]" in err.value.response["response_metadata"]["messages"][0]
    await bot.client.views_publish(user_id=ALICE, view={"type": "home", "blocks": [section] * 100})
    assert await api_error(bot.client.views_publish(user_id="U0NOBODY", view=too_many)) == "invalid_arguments"
    modal = {"type": "modal", "blocks": []}
    assert await api_error(bot.client.views_publish(user_id=ALICE, view=modal)) == "invalid_arguments"
    stale = bot.client.views_publish(user_id=BOB, view={"type": "home", "blocks": []}, hash="1.stale")
    assert await api_error(stale) == "hash_conflict"
    fake.home_tab_enabled = False
    off = bot.client.views_publish(user_id=ALICE, view={"type": "home", "blocks": []})
    assert await api_error(off) == "not_enabled"


async def test_users_info_says_who_administers_the_workspace(fake):
    fake.add_user("U0CAROL", "carol", is_admin=True)
    fake.add_user("U0OWEN", "owen", is_owner=True)
    client = fake.client()
    flags = {}
    for user in (ALICE, "U0CAROL", "U0OWEN"):
        info = (await client.users_info(user=user))["user"]
        flags[user] = (info["is_admin"], info["is_owner"])
    assert flags == {ALICE: (False, False), "U0CAROL": (True, False), "U0OWEN": (True, True)}
    assert fake.mention(BOB) == "<@U0BOB|bob>"
