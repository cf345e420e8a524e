"""Who may do what with the goals of a channel: start them (starters), decide their approvals and
control them (approvers), control them (controllers: stop, pause, resume, steer, change budgets),
and change these roles with `/goal admin` (admins) — plus the size of budget increase that needs a
second person.

A channel's roles come from, in order: what `/goal admin` set for it (bot.db), its entry in
GOALTENDER_ROLES, the "*" entry there, then the defaults: anyone may start a goal; the approvers
are GOALTENDER_APPROVERS, the admins GOALTENDER_ADMINS; nobody else controls goals. A goal's owner
always controls it and decides its approvals. Slack's workspace admins and owners (users.info) and
GOALTENDER_ADMINS may always run `/goal admin`.

People are told apart by Slack user id; the runner hears of them as Persons with their names
(bot/people.py), and the bot's own audit trail keeps `slack:<id>` (`actor`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot import render
from goaltender.bot.budget_size import Threshold
from goaltender.bot.config import BotSettings
from goaltender.bot.people import People
from goaltender.storage.bot_store import BotStore

log = logging.getLogger("goaltender.bot")

Role = Literal["starters", "approvers", "controllers", "admins"]
ROLES: tuple[Role, ...] = ("starters", "approvers", "controllers", "admins")
BUDGET_RULE = "budget_second_person"
EVERYONE = ("everyone", "*")


class Owned(Protocol):
    """What rights are checked against: a goal's thread, or a goal still queued for a runner."""

    @property
    def channel(self) -> str: ...

    @property
    def owner(self) -> str: ...


def actor(user: str) -> str:
    """How the runner hears of a Slack user who acted: `slack:U123`."""
    return f"slack:{user}"


@dataclass(frozen=True)
class Members:
    """The people who hold a role in a channel, and where that came from (for `/goal admin show`)."""

    everyone: bool = False
    users: tuple[str, ...] = ()
    source: str = "default"

    @classmethod
    def of(cls, entries: Iterable[str], source: str) -> Members:
        entries = [e.strip() for e in entries if e.strip()]
        users = tuple(dict.fromkeys(e for e in entries if e.lower() not in EVERYONE))
        return cls(any(e.lower() in EVERYONE for e in entries), users, source)

    @classmethod
    def stored(cls, value: dict[str, Any], source: str) -> Members:
        return cls(bool(value.get("everyone")), tuple(value.get("users") or ()), source)

    def to_store(self) -> dict[str, Any]:
        return {"everyone": self.everyone, "users": list(self.users)}

    def __contains__(self, user: object) -> bool:
        return self.everyone or user in self.users

    def __bool__(self) -> bool:
        return self.everyone or bool(self.users)

    def plus(self, users: Iterable[str]) -> Members:
        return replace(self, users=tuple(dict.fromkeys([*self.users, *users])))

    def minus(self, users: Iterable[str]) -> Members:
        gone = set(users)
        return replace(self, users=tuple(u for u in self.users if u not in gone))

    def describe(self) -> str:
        if self.everyone:
            return "everyone"
        return ", ".join(render.user_ref(u) for u in self.users) or "nobody"


class Roles:
    """The roles of every channel, and who may do what to a goal."""

    def __init__(self, settings: BotSettings, store: BotStore, client: AsyncWebClient):
        self.settings = settings
        self.store = store
        self.client = client
        self.people = People(client)
        """Slack users as the runner hears of them (by name): one cache for the whole bot."""

    async def members(self, channel: str, role: Role) -> Members:
        setting = await self.store.channel_setting(channel, role)
        if setting is not None:
            return Members.stored(setting.value, f"set here by {render.user_ref(setting.set_by)}")
        for key in (channel, "*"):
            config = self.settings.roles.get(key)
            if config is not None and (entries := getattr(config, role)) is not None:
                return Members.of(entries, "configuration")
        if role == "starters":
            return Members(everyone=True)
        if role == "approvers" and self.settings.approvers:
            return Members.of(self.settings.approvers, "configuration")
        if role == "admins" and self.settings.admins:
            return Members.of(self.settings.admins, "configuration")
        return Members()

    async def set(self, channel: str, role: Role, members: Members | None, by: str) -> None:
        """Set a channel's role (None: back to the configuration)."""
        await self.store.set_channel_setting(channel, role, members.to_store() if members else None, by)

    async def may_start(self, channel: str, user: str) -> bool:
        return user in await self.members(channel, "starters")

    async def may_decide(self, thread: Owned, user: str) -> bool:
        """Approvals of a goal: its owner and the channel's approvers."""
        return user == thread.owner or user in await self.members(thread.channel, "approvers")

    async def may_control(self, thread: Owned, user: str) -> bool:
        """Stop, pause, resume, steer, change the budget: the owner, approvers and controllers."""
        if await self.may_decide(thread, user):
            return True
        return user in await self.members(thread.channel, "controllers")

    async def who_controls(self, thread: Owned) -> str:
        """Who may control a goal, for a refusal: "<@U1> (the owner) or an approver"."""
        others = ["an approver"]
        if await self.members(thread.channel, "controllers"):
            others.append("a controller of this channel")
        return f"{render.user_ref(thread.owner)} (the owner) or " + " or ".join(others)

    async def is_admin(self, channel: str, user: str) -> bool:
        """May `user` change this channel's roles: a configured or channel admin, or a Slack
        workspace admin or owner."""
        if user in self.settings.admins or user in await self.members(channel, "admins"):
            return True
        try:
            info = (await self.client.users_info(user=user)).get("user") or {}
        except SlackApiError as exc:
            log.warning("users.info for %s failed: %s", user, exc.response.get("error"))
            return False
        return bool(info.get("is_admin") or info.get("is_owner") or info.get("is_primary_owner"))

    async def budget_rule(self, channel: str) -> tuple[Threshold | None, str]:
        """The size of budget increase that needs a second person here (None: none does), and
        where that came from."""
        setting = await self.store.channel_setting(channel, BUDGET_RULE)
        if setting is not None:
            return Threshold.parse(setting.value), f"set here by {render.user_ref(setting.set_by)}"
        for key in (channel, "*"):
            config = self.settings.roles.get(key)
            if config is not None and config.budget_second_person is not None:
                return Threshold.parse(config.budget_second_person), "configuration"
        if self.settings.budget_second_person is not None:
            return Threshold.parse(self.settings.budget_second_person), "configuration"
        return None, "default"

    async def set_budget_rule(self, channel: str, size: str | None, by: str) -> None:
        """Set this channel's budget rule (`1h`, `50%`, `off`); None: back to the configuration."""
        await self.store.set_channel_setting(channel, BUDGET_RULE, size, by)
