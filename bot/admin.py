"""`/goal admin …`: a channel's roles and budget rule, shown to anyone, changed by an admin.

    /goal admin show                       who holds each role here, and the budget rule
    /goal admin approvers add @ana @ben    roles: starters, approvers, controllers, admins
    /goal admin approvers remove @ana
    /goal admin controllers everyone       anyone in the channel
    /goal admin starters only @ana @ben    exactly these people
    /goal admin controllers nobody
    /goal admin approvers reset            back to the configuration
    /goal admin budget 2h                  increases over 2h (or `50%`) need a second person
    /goal admin budget off | reset

People are named by picking them in Slack's @-menu: Slack sends them as `<@U123|ana>` (the command
escapes users, `should_escape: true` in manifest.yml); a bare user id `U123` works too. Changes are
stored in bot.db and said in the channel; each change, and each refused attempt, goes into the audit
trail in bot.db.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from goaltender.bot import audit, render
from goaltender.bot.budget_size import Threshold
from goaltender.bot.outbox import Outbox
from goaltender.bot.roles import ROLES, Members, Role, Roles, actor
from goaltender.storage.bot_audit import Outcome

HOWTO = (
    "Roles in this channel: `/goal admin show`; an admin changes them with "
    "`/goal admin <role> add|remove|only @person…`, `/goal admin <role> everyone|nobody|reset` "
    "(roles: starters, approvers, controllers, admins) and the budget rule with "
    "`/goal admin budget 2h|50%|off|reset`."
)
WHAT = {
    "starters": "may start goals",
    "approvers": "decide approvals and control every goal",
    "controllers": "may stop, pause, resume, steer and change the budget of every goal",
    "admins": "may change these roles (as may workspace admins)",
}
_PERSON = re.compile(r"^(?:<@([UW][A-Z0-9]+)(?:\|[^>]*)?>|@?([UW][A-Z0-9]{2,}))$")
_VERBS = ("add", "remove", "only", "set", "everyone", "nobody", "reset")

Action = Literal["show", "role", "budget"]


@dataclass(frozen=True)
class AdminCommand:
    action: Action
    role: Role | None = None
    verb: str | None = None  # add, remove, only, everyone, nobody, reset
    users: tuple[str, ...] = ()
    size: str | None = None  # the budget rule: `2h`, `50%`, `off`; None with verb reset


def command_words(text: str) -> str | None:
    """The words after `admin` when a /goal's text is an admin command, else None."""
    first, _, rest = text.strip().partition(" ")
    if first.lower() != "admin":
        return None
    head = rest.split()[0].lower() if rest.split() else ""
    if not head or head in ("show", "budget") or _role(head) is not None:
        return rest
    return None


def parse_command(words: str) -> AdminCommand:
    """The words after `/goal admin`; ValueError saying how to fix them."""
    parts = words.split()
    if not parts or parts[0].lower() == "show":
        return AdminCommand("show")
    head, verb, rest = parts[0].lower(), (parts[1].lower() if len(parts) > 1 else ""), parts[2:]
    if head == "budget":
        if verb == "reset" and not rest:
            return AdminCommand("budget", verb="reset")
        size = " ".join(parts[1:])
        Threshold.parse(size)  # ValueError says how
        return AdminCommand("budget", size=size or "off")
    role = _role(head)
    if role is None or verb not in _VERBS:
        raise ValueError(f"I could not read `{words}`. {HOWTO}")
    verb = "only" if verb == "set" else verb
    users = tuple(_person(word) for word in rest)
    if verb in ("add", "remove", "only") and not users:
        raise ValueError(f"Name the people: `/goal admin {role} {verb} @ana @ben`.")
    if verb in ("everyone", "nobody", "reset") and users:
        raise ValueError(f"`{verb}` takes nobody's name: `/goal admin {role} {verb}`.")
    return AdminCommand("role", role, verb, users)


def _role(word: str) -> Role | None:
    for role in ROLES:
        if word in (role, role[:-1]):
            return role
    return None


def _person(word: str) -> str:
    match = _PERSON.match(word.strip(",;"))
    if match is None:
        raise ValueError(
            f"I can't tell who `{word}` is: pick people from Slack's @-menu (or give their user id)."
        )
    return match.group(1) or match.group(2)


class Admin:
    """Shows and changes a channel's roles and budget rule."""

    def __init__(self, roles: Roles, outbox: Outbox):
        self.roles = roles
        self.outbox = outbox

    async def command(
        self, words: str, channel: str, user: str, reply: Callable[[str], Awaitable[None]]
    ) -> None:
        try:
            command = parse_command(words)
        except ValueError as exc:
            await reply(str(exc))
            return
        if command.action == "show":
            await reply(await self.describe(channel))
            return
        if not await self.roles.is_admin(channel, user):
            await self._audit(user, command, "refused", "not an admin here", channel)
            await reply(
                "Only a workspace admin or one of this channel's Goaltender admins can change its "
                "roles; nothing changed. `/goal admin show` lists them."
            )
            return
        if command.action == "budget":
            await self.roles.set_budget_rule(channel, command.size, user)
            rule, _ = await self.roles.budget_rule(channel)
            said = _rule_text(rule)
            await self._audit(user, command, "done", said, channel)
            await self._announce(channel, f"{render.user_ref(user)} set this channel's budget rule: {said}.")
            await reply(f"Budget rule: {said}.")
            return
        assert command.role is not None
        current = await self.roles.members(channel, command.role)
        new: Members | None
        match command.verb:
            case "add":
                new = current.plus(command.users)
            case "remove":
                new = current.minus(command.users)
            case "only":
                new = Members.of(command.users, "")
            case "everyone":
                new = Members(everyone=True)
            case "nobody":
                new = Members()
            case _:
                new = None
        await self.roles.set(channel, command.role, new, user)
        now = await self.roles.members(channel, command.role)
        await self._audit(user, command, "done", f"now {_plain(now)}", channel)
        await self._announce(
            channel,
            f"{render.user_ref(user)} changed this channel's *{command.role}* "
            f"({WHAT[command.role]}): {now.describe()}.",
        )
        await reply(f"*{command.role}* here: {now.describe()} ({now.source}).")

    async def describe(self, channel: str) -> str:
        lines = ["*Goaltender roles in this channel*"]
        for role in ROLES:
            members = await self.roles.members(channel, role)
            lines.append(f"• *{role}* ({WHAT[role]}): {members.describe()} _({members.source})_")
        rule, source = await self.roles.budget_rule(channel)
        lines.append(f"• *budget*: {_rule_text(rule)} _({source})_")
        lines.append("A goal's owner always controls it and decides its approvals. " + HOWTO)
        return "\n".join(lines)

    async def _audit(
        self, user: str, command: AdminCommand, outcome: Outcome, said: str, channel: str
    ) -> None:
        action = "budget rule" if command.action == "budget" else "role"
        await audit.record(
            self.roles.store, user, action, outcome, f"{_words(command)}: {said}", channel=channel
        )

    async def _announce(self, channel: str, text: str) -> None:
        await self.outbox.enqueue(channel, "post", render.notice(f":busts_in_silhouette: {text}"))


def _words(command: AdminCommand) -> str:
    """The command as the trail keeps it, people as `slack:U123`: `controllers add slack:U0BOB`."""
    if command.action == "budget":
        return f"budget {command.size or command.verb}"
    return " ".join([command.role or "", command.verb or "", *map(actor, command.users)]).strip()


def _plain(members: Members) -> str:
    if members.everyone:
        return "everyone"
    return ", ".join(map(actor, members.users)) or "nobody"


def _rule_text(rule: Threshold | None) -> str:
    if rule is None:
        return "no increase needs a second person"
    if rule.hours == 0:
        return "every increase needs a second person"
    over = f"+{rule.text} of a limit" if rule.share is not None else rule.text
    return f"increases over {over} need a second person"
