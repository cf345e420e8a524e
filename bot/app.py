"""The Slack bot's app: the Bolt AsyncApp (Socket Mode, or HTTP), its lifecycle, and the listeners
that hand each Slack request to the part of the bot that owns it — intake (`/goal`, @mentions,
goal channels), thread replies, approvals and budget increases, digests, roles (`/goal admin`),
the team's views (`/goal list`, `/goal show`, the App Home tab) — plus the links to the runners,
whose events are written into the goals' threads.

Every listener acks first (events are acked by Bolt before the listener runs), and every
subscribed event type has a listener so Socket Mode acks it. Slack events are deduplicated by
their event_id (bot.db) in a middleware, before they are acked: a redelivery is acked and
dropped. A listener that fails is logged by the app's error handler. Every write to Slack goes
through the outbox.

Before serving, the bot checks its tokens with Slack (a refused one stops it, naming the
variable); a token refused later, on any call, or the app_uninstalled / tokens_revoked event, stops
it the same way (bot/slack_client.py). Every Web API call has a deadline (GOALTENDER_SLACK_TIMEOUT_S).
Its long-lived tasks (the outbox, the runner links, the health watcher) are watched: one that ends
while the bot runs is logged as an error. Listeners' own calls to Slack (auth.test,
conversations.info, users.info, views.publish, ...) go through slack_sdk's retry handlers; the
outbox's writes do not (it retries them itself, looking before posting again).

Entry point: `goaltender.bot.app:main`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.response import BoltResponse
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)

from goaltender import readiness
from goaltender.bot import admin, digest, views
from goaltender.bot.admin import Admin
from goaltender.bot.approvals import Approvals
from goaltender.bot.budget_guard import BudgetGuard
from goaltender.bot.config import BotSettings
from goaltender.bot.databases import Databases
from goaltender.bot.files import Files
from goaltender.bot.gallery import Gallery
from goaltender.bot.gone_channels import GoneChannels
from goaltender.bot.health import HealthMonitor
from goaltender.bot.intake import GoalRefused, Intake, command_text
from goaltender.bot.links import RunnerPool
from goaltender.bot.membership import Membership
from goaltender.bot.messages import Messages
from goaltender.bot.monitoring import bot_endpoint
from goaltender.bot.outbox import Outbox, Payload
from goaltender.bot.pruning import prune_bot
from goaltender.bot.roles import Roles
from goaltender.bot.slack_client import WatchedWebClient, slack_session
from goaltender.bot.slack_errors import failure_of
from goaltender.bot.thread import ThreadWriter
from goaltender.bot.tokens import TokenRefused, check_app_token, check_bot_token
from goaltender.bot.views import Views
from goaltender.runner.logs import BOT_TEXT, configure_logging, say
from goaltender.runner.monitoring import MetricsEndpoint, MetricsUnavailable
from goaltender.runner.secrets import Redactor, redact_output
from goaltender.storage.bot_store import BotStore, OutboxItem
from goaltender.storage.db import UnusableDatabase
from goaltender.storage.records import Event

log = logging.getLogger("goaltender.bot")

Reply = Callable[[str], Awaitable[None]]  # an answer only the person who asked sees
Show = Callable[[Payload], Awaitable[None]]  # a view (blocks) only they see

FIRST_PRUNE_S = 60.0  # the first prune of bot.db comes this long after the start
SLACK_UNREACHABLE_RETRY_S = (1.0, 30.0)  # first and longest wait between tries to reach Slack at start


def listener_retry_handlers() -> list[AsyncRetryHandler]:
    """For the calls listeners make and wait on: a dropped connection, a 429 (after its
    Retry-After) and a 500/503 are tried again, twice, inside slack_sdk."""
    return [
        AsyncConnectionErrorRetryHandler(max_retry_count=2),
        AsyncRateLimitErrorRetryHandler(max_retry_count=2),
        AsyncServerErrorRetryHandler(max_retry_count=2),
    ]


def writes_client(client: WatchedWebClient) -> WatchedWebClient:
    """The outbox's client: the same token, connections (and deadline) and watch on the token,
    and no retries inside slack_sdk. A blind retry of a post whose answer was lost would post it
    twice; the outbox first looks for it, and waits for a 429's Retry-After without holding up
    other channels."""
    return WatchedWebClient(
        token=client.token,
        base_url=client.base_url,
        session=client.session,
        retry_handlers=[],
        auth=client.auth,
    )


class GoaltenderBot:
    """The bot: an AsyncApp, bot.db, the outbox, the links to the runners, and the parts that
    turn Slack requests and runner events into each other."""

    def __init__(self, settings: BotSettings, store: BotStore, client: WatchedWebClient):
        self.settings = settings
        self.store = store
        self.client = client
        self.auth = client.auth
        secret = settings.slack_signing_secret
        # HTTP mode: Bolt verifies every request's signature (and age) with the signing secret.
        self.app = AsyncApp(client=client, signing_secret=secret.get_secret_value() if secret else None)
        self.outbox = Outbox(
            store,
            writes_client(client),
            per_channel_interval_s=settings.outbox_interval_s,
            max_attempts=settings.outbox_max_attempts,
            backoff_s=settings.outbox_backoff_s,
            backoff_cap_s=settings.outbox_backoff_cap_s,
        )
        self.databases = Databases(store, self.outbox)
        self.pool = RunnerPool(
            settings.runner_targets(),
            on_event=self._on_runner_event,
            load_cursor=store.cursor,
            on_change=self.on_link_change,
            on_database=self.databases.on_database,
            on_rewind=self.databases.on_rewind,
        )
        plots_dir = settings.home / "plots"
        self.roles = Roles(settings, store, client)
        self.membership = Membership(client, self.auth)
        self.intake = Intake(store, self.pool, self.outbox, self.roles, self.membership)
        self.gone = GoneChannels(store, self.pool, self.outbox, client)
        self.outbox.on_failed = self._on_write_parked
        self.threads = ThreadWriter(store, self.pool, self.outbox, plots_dir, self.intake.submitting)
        self.budget = BudgetGuard(store, self.pool, self.outbox, self.roles)
        self.views = Views(store, self.pool, self.outbox, self.roles, client)
        self.messages = Messages(
            store,
            self.pool,
            self.outbox,
            self.intake,
            settings.goal_channels,
            roles=self.roles,
            budget=self.budget,
            views=self.views,
            gallery=Gallery(self.pool, plots_dir),
            people=self.roles.people,
            files=Files(client, self.pool, max_bytes=int(settings.max_file_mb * 1024 * 1024)),
        )
        self.approvals = Approvals(store, self.pool, self.outbox, self.roles, self.budget)
        self.digests = digest.Digests(store, self.pool, self.outbox, plots_dir)
        self.admin = Admin(self.roles, self.outbox)
        self.health = HealthMonitor(store, self.pool, self.outbox, log_every_s=settings.health_log_interval_s)
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self.handler: AsyncSocketModeHandler | None = None
        self.http: web.AppRunner | None = None
        self.http_port: int | None = None
        """HTTP mode: the port the bot listens on (useful when configured as 0)."""
        self.metrics: MetricsEndpoint | None = None
        """The Prometheus endpoint, while it serves (GOALTENDER_BOT_METRICS_PORT)."""
        self._register()

    @classmethod
    async def open(cls, settings: BotSettings) -> GoaltenderBot:
        token = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else None
        # One HTTP session for every Web API call: connections (and TLS) are reused, not one per
        # call; it carries the calls' deadline (slack_sdk applies its own only to sessions it makes).
        kwargs: dict[str, Any] = {"token": token, "session": slack_session(settings.slack_timeout_s)}
        if settings.slack_api_url:
            kwargs["base_url"] = settings.slack_api_url
        client = WatchedWebClient(**kwargs, retry_handlers=listener_retry_handlers())
        try:
            store = await BotStore.open(settings.db_path)
        except BaseException:
            await kwargs["session"].close()
            raise
        try:
            return cls(settings, store, client)
        except BaseException:  # bot.db's thread, left open, would keep the process from exiting
            await store.close()
            await kwargs["session"].close()
            raise

    async def start(self) -> None:
        """Check the tokens (TokenRefused when Slack refuses one), then start the outbox, the
        runner links, the health watcher, the digest schedules and the Socket Mode connection. The
        metrics endpoint comes first: it shows the links and the outbox while Slack is unreachable."""
        self.metrics = bot_endpoint(self)
        if self.metrics is not None:
            self.metrics.start()
        await self.check_tokens()
        self._watch(self.outbox.run(), "the outbox")
        self._watch(self.pool.run(), "the runner links")
        self._watch(self.health.watch(), "the health watcher")
        self._watch(self._prune_forever(), "the retention of bot.db")
        # The names of the goals' owners, for mentions in what the runner wrote about them.
        owners = [thread.owner for thread in await self.store.threads()][:500]
        self._tasks.append(asyncio.ensure_future(self.roles.people.learn(owners)))
        self.digests.schedules.start(await self.store.digests())
        if self.settings.slack_mode == "http":
            server = self.app.server(port=self.settings.http_port, host=self.settings.http_host)
            self.http = web.AppRunner(server.web_app)
            await self.http.setup()
            site = web.TCPSite(self.http, self.settings.http_host, self.settings.http_port)
            await site.start()
            self.http_port = self.http.addresses[0][1]
            log.info(
                "listening for Slack on http://%s:%d/slack/events", self.settings.http_host, self.http_port
            )
        elif self.settings.slack_app_token is not None:
            self.handler = AsyncSocketModeHandler(
                self.app, app_token=self.settings.slack_app_token.get_secret_value(), web_client=self.client
            )
            await self.handler.connect_async()

    async def check_tokens(self) -> None:
        """auth.test (and, in Socket Mode, apps.connections.open) until Slack answers: a refused
        token raises TokenRefused; a Slack that cannot be reached is tried again, and logged."""
        wait, longest = SLACK_UNREACHABLE_RETRY_S
        while True:
            try:
                identity = await check_bot_token(self.client)
                if self.settings.slack_mode == "socket" and self.settings.slack_app_token is not None:
                    await check_app_token(self.client, self.settings.slack_app_token.get_secret_value())
                break
            except TokenRefused:
                raise
            except Exception as exc:
                log.warning(
                    "cannot reach Slack to check the tokens (%s); trying again in %.0fs",
                    failure_of(exc).reason,
                    wait,
                )
                await asyncio.sleep(wait)
                wait = min(longest, wait * 2)
        self.health.identity = identity
        self.membership.name = identity.name
        log.info("Slack: connected as %s", identity.describe())

    def _watch(self, work: Awaitable[None], what: str) -> None:
        """Run one of the bot's long-lived tasks; should it end while the bot runs, say so."""
        task = asyncio.ensure_future(work)
        task.add_done_callback(functools.partial(self._task_ended, what))
        self._tasks.append(task)

    def _task_ended(self, what: str, task: asyncio.Task) -> None:
        if self._closed or task.cancelled():
            return
        log.error("%s stopped while the bot runs", what, exc_info=task.exception())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)  # (it waits for the server's poll, up to 0.5 s)
        if self.handler is not None:
            with contextlib.suppress(Exception):
                await self.handler.close_async()
        if self.http is not None:
            await self.http.cleanup()
        self.digests.schedules.shutdown()
        self.pool.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.store.close()
        if self.client.session is not None:
            await self.client.session.close()

    async def _prune_forever(self) -> None:
        """Drop what bot.db no longer needs now and then (bot/pruning.py): the first time a minute
        after the start, then every `prune_every_s`. A failed prune is logged; the next tries again."""
        days = self.settings.retention_days
        if not days:
            log.info("retention is off (GOALTENDER_RETENTION_DAYS=0): bot.db keeps every delivered post")
            return
        await asyncio.sleep(min(FIRST_PRUNE_S, self.settings.prune_every_s))
        while True:
            try:
                for line in (await prune_bot(self.store, days)).lines(str(self.settings.db_path)):
                    log.info("retention: %s", line)
            except Exception:  # the next prune tries again
                log.exception("retention: pruning bot.db failed; the next prune tries again")
            await asyncio.sleep(self.settings.prune_every_s)

    async def run_forever(self) -> None:
        """Serve until cancelled; TokenRefused when Slack refuses a token, at start or later (a
        token revoked, the app uninstalled): the writes waiting stay in bot.db for the next start."""
        try:
            await self.start()  # (inside: a refused token still closes bot.db, or its thread holds the exit)
            readiness.ready(self._serving_status())
            raise await self.auth.wait()
        finally:
            await self.close()

    def _serving_status(self) -> str:
        """What `systemctl status` shows once the bot serves."""
        who = self.health.identity.describe() if self.health.identity else "?"
        how = f"HTTP on port {self.http_port}" if self.http_port is not None else "Socket Mode"
        return f"connected to Slack as {who} ({how}); runners: {', '.join(link.name for link in self.pool)}"

    async def _on_write_parked(self, item: OutboxItem, error: str) -> None:
        await self.intake.on_outbox_failed(item, error)
        await self.gone.on_write_parked(item, error)

    async def _on_runner_event(self, runner: str, event: Event) -> None:
        # The pool is made before the thread writer that needs it: this passes its events on.
        await self.threads.on_runner_event(runner, event)

    async def on_link_change(self, runner: str, up: bool) -> None:
        """A runner came back: start its queued goals, refresh its cards. It went down: say so on
        the cards of its active goals (from the last status seen; nothing is lost meanwhile)."""
        if up:
            await self.intake.drain_queue()
        await self.threads.show_runner(runner, up, why=self.pool[runner].last_error or "not connected")

    # ---- listeners ----

    def _subcommand(
        self, raw: str, text: str, channel: str, user: str
    ) -> Callable[[Reply, Show], Awaitable[None]] | None:
        """What `/goal <text>` runs when it is a subcommand (health, admin, a view, digest): called
        with how to answer and how to show a view; None when the text is meant as a goal."""
        if text.lower() == "health":
            return lambda reply, show: self._health(reply)
        if (roles := admin.command_words(raw)) is not None:
            return lambda reply, show: self.admin.command(roles, channel, user, reply)
        if (view := views.command_words(text)) is not None:
            return lambda reply, show: self.views.command(*view, channel, show)
        if (schedule := digest.command_words(text)) is not None:
            return lambda reply, show: self.digests.command(schedule, channel, user, reply)
        return None

    async def _health(self, reply: Reply) -> None:
        await reply((await self.health.report()).text())

    def _register(self) -> None:
        app = self.app

        @app.use
        async def once_per_event(
            body: dict[str, Any], next: Callable[[], Awaitable[None]]
        ) -> BoltResponse | None:
            """Slack redelivers an event it thinks was missed (same event_id): ack it, act once."""
            event_id = body.get("event_id")
            if event_id and not await self.store.first_sight(event_id):
                return BoltResponse(status=200, body="")
            await next()
            return None

        @app.error
        async def log_failure(error: Exception) -> None:
            log.error("a Slack listener failed", exc_info=error)

        @app.command("/goal")
        async def goal_command(ack, command, respond):
            raw = (command.get("text") or "").strip()
            text = command_text(raw)  # users, channels and links as typed (the command escapes them)
            channel, user = command["channel_id"], command["user_id"]
            # Subcommands first: their words (`admin budget 0h`) are no goal, and must not be
            # refused as one.
            subcommand = self._subcommand(raw, text, channel, user)
            if subcommand is None:
                try:
                    request = self.intake.read(text, channel, user)
                except GoalRefused as refusal:
                    await ack(text=str(refusal))
                    return
            await ack()
            trigger = command.get("trigger_id")
            if trigger and not await self.store.first_sight(f"command:{trigger}"):
                return  # the same invocation delivered again (same trigger_id): acted on once

            async def reply(message: str) -> None:
                await respond(text=message, response_type="ephemeral")

            async def show(payload: Payload) -> None:
                await respond(text=payload["text"], blocks=payload["blocks"], response_type="ephemeral")

            if subcommand is not None:
                await subcommand(reply, show)
            else:
                await self.intake.submit(request, reply, respond=reply)

        @app.event("app_mention")
        async def app_mention(event, context):
            await self.messages.on_message(event, context.get("bot_user_id"), mention=True)

        @app.event("message")
        async def message(event, context):
            await self.messages.on_message(event, context.get("bot_user_id"), mention=False)

        @app.event("reaction_added")
        async def reaction_added(event):
            await self.approvals.on_reaction(event)
            await self.messages.on_reaction(event)  # 🛑 on a goal's card

        @app.action("approve")
        @app.action("reject")
        async def decide_button(ack, body, respond):
            await ack()
            await self.approvals.on_button(body, respond)

        @app.action("budget_approve")
        @app.action("budget_reject")
        async def decide_budget(ack, body, respond):
            await ack()
            await self.budget.on_button(body, respond)

        @app.event("app_home_opened")
        async def home_opened(event):
            if not event.get("user"):
                log.warning("a Slack app_home_opened event without user was ignored")
            elif event.get("tab", "home") == "home":
                await self.views.publish_home(event["user"])

        @app.event("app_uninstalled")
        async def uninstalled(event):
            self.auth.lose("SLACK_BOT_TOKEN", "app_uninstalled")

        @app.event("tokens_revoked")
        async def tokens_revoked(event):
            if (event.get("tokens") or {}).get("bot"):  # (user tokens the app may hold are not the bot's)
                self.auth.lose("SLACK_BOT_TOKEN", "tokens_revoked")

        @app.event(re.compile(".*"))
        async def everything_else(body):
            """Subscribed events nobody handles (reaction_removed, member_joined_channel, ...):
            acked all the same, so Slack does not redeliver them."""


# ---- entry point ----


def missing_tokens_message(missing: list[str]) -> str:
    lines = [
        f"goaltender bot: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set.",
        "Create the Slack app from manifest.yml (api.slack.com/apps -> Create New App -> From a manifest),",
        "install it to your workspace, then put its tokens in the environment:",
        "  export SLACK_BOT_TOKEN=xoxb-...   # OAuth & Permissions -> Bot User OAuth Token",
    ]
    if "SLACK_SIGNING_SECRET" in missing:
        lines.append(
            "  export SLACK_SIGNING_SECRET=...   # Basic Information -> App Credentials -> Signing Secret"
        )
    else:
        lines.append(
            "  export SLACK_APP_TOKEN=xapp-...   # Basic Information -> App-Level Tokens (scope connections:write)"
        )
    # The service's environment is not a shell's: `goaltender service install` wrote bot.env for them.
    lines.append(
        "(as a systemd service: in its bot.env, /etc/goaltender/bot.env by default, without `export`; docs/deploy.md, 'Services')"
    )
    return "\n".join(lines) + "\n"


async def _serve_until_signalled(settings: BotSettings) -> None:
    """Run the bot until SIGTERM (systemd, kill) or SIGINT, then close it in order: what the
    outbox has not sent stays in bot.db for the next start, and the runners' events not yet
    written there are not acknowledged, so the runners send them again."""
    serving = asyncio.ensure_future(_open_and_run(settings))
    received: list[str] = []

    def shut_down(sig: signal.Signals) -> None:
        if not received:
            received.append(sig.name)
            readiness.stopping(f"shutting down ({sig.name})")
            log.info("bot shutting down (%s); what Slack has not taken yet waits in bot.db", sig.name)
        serving.cancel()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shut_down, sig)
    try:
        await serving
    except asyncio.CancelledError:
        if not received:
            raise


async def _open_and_run(settings: BotSettings) -> None:
    bot = await GoaltenderBot.open(settings)
    await bot.run_forever()


def main() -> None:
    """`goaltender bot`: run the Slack bot (Socket Mode, or HTTP with GOALTENDER_SLACK_MODE=http)
    until SIGTERM or SIGINT, then exit 0."""
    settings = BotSettings()
    # The bot's log, and what libraries log or warn in it, is redacted as the runner's is (Slack's
    # tokens are secret-looking variables, and their shapes are known).
    redact_output(Redactor.from_environment())
    configure_logging(settings.log_format, BOT_TEXT)
    if missing := settings.missing_tokens():
        say(missing_tokens_message(missing).rstrip("\n"), settings.log_format)
        raise SystemExit(2)
    # The token is in the settings now. Bolt would read SLACK_BOT_TOKEN again on its own and warn
    # at every start that it ignores it for the client the bot gives it; no child needs it either.
    os.environ.pop("SLACK_BOT_TOKEN", None)

    try:
        with contextlib.suppress(KeyboardInterrupt):  # a ^C before the handlers are in place
            asyncio.run(_serve_until_signalled(settings))
    except TokenRefused as refused:
        say(f"goaltender bot: {refused}", settings.log_format)
        raise SystemExit(2) from None
    except (UnusableDatabase, MetricsUnavailable) as exc:  # said, not a traceback
        say(f"goaltender bot: cannot start: {exc}", settings.log_format)
        raise SystemExit(1) from None
