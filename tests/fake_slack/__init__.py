"""A fake Slack workspace for tests: the Web API, file uploads, response_urls and Socket Mode.

It speaks the wire protocol, so the real `slack_bolt` AsyncApp + AsyncSocketModeHandler and the real
`slack_sdk` AsyncWebClient run against it unmodified:

    async with FakeSlack() as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
        app = AsyncApp(client=client)
        handler = AsyncSocketModeHandler(app, app_token=fake.app_token, web_client=client)
        await handler.connect_async()        # apps.connections.open -> ws://.../link -> hello
        msg = await fake.user_posts(fake.general, "hello")
        reply = await fake.wait_for_message(fake.general, thread_ts=msg.ts)
        await handler.close_async()           # before the fake stops, or the client keeps reconnecting

The workspace is an in-memory model: channels (members, archived) -> messages (ts, thread_ts,
user/bot_id, text, blocks, metadata, reactions, files). Timestamps come from a fake clock and
increase monotonically ("1700000000.000100", "1700000000.000200", ...).

What it enforces, as Slack does (errors are HTTP 200 + {"ok": false, "error": ...} unless noted):
- tokens: no token -> not_authed; unknown -> invalid_auth; the app token (xapp-) only for
  apps.connections.open and the bot token for everything else -> not_allowed_token_type.
- channels: unknown -> channel_not_found; the bot not a member -> not_in_channel (posting,
  reacting, reading history, sharing files); archived -> is_archived.
- content: nothing to post -> no_text; text over 40,000 chars -> msg_too_long; blocks not a JSON
  array -> invalid_blocks_format; more than 50 blocks, a section text over 3,000 chars, fields over
  10 x 2,000, a header over 150, a button text over 75 / value over 2,000, unknown block types,
  missing required fields, duplicate block_ids, an image block pointing at a file that was never
  shared -> invalid_blocks (with Slack's "errors" list and json-pointers); bad metadata ->
  invalid_metadata_format; a malformed thread_ts -> invalid_thread_ts (a well-formed ts of a
  message that does not exist is accepted, as Slack does, and noted in `fake.warnings`).
- messages: chat.update/chat.delete of a missing message -> message_not_found, of someone
  else's -> cant_update_message / cant_delete_message; reactions.add twice -> already_reacted.
- views.publish: `view` a JSON object of type "home" (up to 100 blocks, validated as above with
  pointers under /view, 250 kB) for a known user, else invalid_arguments; not_enabled when
  `home_tab_enabled` is off; hash_conflict when `hash` is not the published view's.
- files: files.info needs files:read (else missing_scope); url_private(_download) serves a file's
  bytes to the bot token of an app with files:read, and redirects anyone else to sign-in (302).
- users.info: is_admin / is_owner / is_primary_owner as set by add_user(..., is_admin=, is_owner=)
  (or on fake.users[id]); owners are admins too.
- scopes: conversations.info needs channels:read / groups:read / im:read / mpim:read for the
  channel's type (else missing_scope, with "needed" and "provided"); a private channel the bot is
  not in is channel_not_found to it.
- rate limits: `rate_limit()` injects HTTP 429 {"error": "ratelimited"} + `Retry-After: <int>`;
  `limit_channel_rate()` turns on Slack's "about one message per second per channel" for
  chat.postMessage.
- faults, on a chosen method (and channel) for the next `times` calls: `fail()` any
  {"ok": false, "error": ...} (any HTTP status); `fail_text()` an HTTP 503 (or any status) with a
  text/plain body, as a load balancer in front of Slack answers; `drop_connection()` closes the
  socket mid-request (aiohttp raises ServerDisconnectedError), before the method runs or, with
  after=True, after it did. The method "upload" is the upload URLs files.getUploadURLExternal
  hands out (which answer in text). Calls record `status` (0: no answer) and `dropped`.
  `hang()` takes the request and never answers it (until the fake stops; calls record `hung`):
  only the client's own deadline ends the call.
- Slack failing the app, not one call: `revoke_token(token, error)` (every call with that token
  answers `error`, e.g. token_revoked), `uninstall_app()` (app_uninstalled and tokens_revoked
  events, then both tokens revoked), `delete_channel(ch)` (channel_not_found from then on),
  `archive_channel(ch)` (writes answer is_archived). conversations.open (scope im:write) opens
  the bot's DM with a user.
- Socket Mode: envelopes must be acked by envelope_id within `ack_timeout` (3 s). An unacked
  events_api envelope is redelivered with retry_attempt+1 and retry_reason "timeout" (up to
  `max_retries` times, after `retry_delays`); an unacked slash command shows the user
  '/goal failed with the error "operation_timeout"'. Events arrive only for subscribed event
  types (`bot_events`, default: the ones in manifest.yml) in channels the bot is a member of.
  The bot's own posts, edits and reactions come back as events too (`echo_bot_events`), so
  Bolt's IgnoringSelfEvents is exercised.

Scripting (async methods; users default to alice U0ALICE, channels accept id, name or #name):
    msg = await fake.user_posts(ch, text, user)                  # message event (+ app_mention if <@U0BOT>)
    msg = await fake.user_replies(ch, thread_ts, text, user)     # thread reply
    msg = await fake.user_mentions_bot(ch, text, user)           # app_mention AND message, one message
    env = await fake.user_reacts(ch, ts, "+1::skin-tone-3", user)
    msg = await fake.user_shares_file(ch, thread_ts, "paper.pdf", b"%PDF-1.7 ...", text, user)  # file_share
    res = await fake.slash_command("/goal", text, ch, user)     # waits for the ack; res.responses,
    res = await fake.click_button(ch, ts, "approve", None, user) #   res.ephemerals, res.wait_for_response()
    env = await fake.user_opens_home(user)                      # app_home_opened; fake.home_views[user]
    fake.mention(BOB) -> "<@U0BOB|bob>"   # a user in a slash command's text (should_escape: true)
    again = await fake.redeliver(env); await fake.disconnect()
    await fake.wait_for(lambda: ...); await fake.wait_for_message(ch, thread_ts=..., text=...)
    fake.messages(ch, thread_ts=None); fake.thread(ch, ts); fake.ephemerals(user); fake.calls(method)
    fake.add_message(...) seeds history without events; fake.invite_bot(ch); fake.transcript(ch)

response_url (slash commands, clicks): up to 5 posts in 30 min; ephemeral unless
response_type "in_channel"; on a clicked message replace_original: true edits it and
delete_original: true deletes it. An ack() payload with text shows to the user as an ephemeral.

Everything the app did is recorded: `calls()`, `envelopes`, `acks`, `ephemerals()`, `files`,
`warnings`. `wait_for(predicate)` awaits any condition on that state; on timeout the error
includes `describe()` (recent calls, envelopes and channel transcripts).

HTTP mode instead of Socket Mode: `fake.deliver_over_http(request_url, signing_secret)` POSTs every
request, signed as Slack signs them; the 200 answer is the ack.

Close the Socket Mode handler before stopping the fake, or its client keeps trying to reconnect.
slack_sdk sends requests through HTTP(S)_PROXY even for 127.0.0.1 (it ignores NO_PROXY): unset them.

The package, one concern a module (FakeSlack mixes the parts together; they share its state):
- records.py: the workspace's records (Message, Channel, User, File, Call, Ephemeral, Envelope,
  Connection, Injection, Interaction, ...) and SlackError.
- blocks.py: Block Kit: validation with Slack's errors, rich_text for typed messages, block_ids.
- arguments.py: the checks on Web API arguments (channels, text/blocks, metadata, thread_ts).
- payloads.py: the JSON Slack sends: messages, events and file objects.
- web_api.py: the Web API over HTTP (auth, injected failures, rate limits), its method handlers,
  file uploads and response_urls.
- delivery.py: envelopes to the app over Socket Mode (websockets) or HTTP (signed), acks and
  redelivery.
- scripting.py: users acting (posts, replies, mentions, reactions, slash commands, clicks).
- workspace.py: FakeSlack itself: lifecycle, workspace setup, failure injection, looking, waiting.
"""

from .records import ALICE, BOB
from .workspace import FakeSlack

__all__ = ["ALICE", "BOB", "FakeSlack"]
