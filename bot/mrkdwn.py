"""Slack's text: mrkdwn escaping, people as mentions, Markdown -> mrkdwn, and blocks kept within
Slack's limits (section text <= 3,000 characters, split over several sections when longer; at most
50 blocks; about 11,000 characters of block text in all, past which a note says where the rest is).

bot/render.py lays messages out with these; what people and agents wrote goes through escape()
(or people() / user_ref() for who acted), so nothing in it is read as markup or pings anyone.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

Payload = dict[str, Any]

SECTION_MAX = 3000
MAX_BLOCKS = 50
MAX_TOTAL = 11_000  # Slack refuses messages whose blocks add up to ~13k characters
FALLBACK_MAX = 3000


def escape(text: str) -> str:
    """Escape the three characters mrkdwn treats as markup (&, <, >)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_date(when: datetime) -> str:
    """A moment as Slack shows it in each reader's own zone ("Dec 7 14:05"; "Today at 14:05"), with a
    UTC fallback for clients that cannot: `<!date^UNIX^{date_short_pretty} {time}|2026-12-07 14:05 UTC>`."""
    utc = when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
    return f"<!date^{int(utc.timestamp())}^{{date_short_pretty}} {{time}}|{utc:%Y-%m-%d %H:%M} UTC>"


# A file system path (a runner's socket, a workspace): said to operators in logs, never to a channel.
_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/)*[\w.@+-]+")


def no_paths(text: str) -> str:
    """`cannot connect to /run/goaltender/runner.sock: refused` -> `cannot connect to its socket: refused`."""
    return _PATH.sub("its socket" if ".sock" in text else "a path on the server", text)


# How people appear in what the runner records: `U123` (older records), `slack:U123` (what the bot
# sent before it sent Persons), `slack:U123 (Alice) via goaltender-bot (uid 0)` (the runner's audit
# form; older ones have no name). CLI operators are
# anything else ("alice via goaltender (uid 1000)"), shown as plain text.
_ACTOR = re.compile(r"(?:slack:)?([UW][A-Z0-9]{2,})(?:(?: \([^()]*\))? via [^\s()]+ \(uid \d+\))?")
# Where runner-written text names who acted: at its very start ("stopped by slack:U1 via … (uid 0):
# enough", "paused by U0BOB" in older records, "slack:U1: deadline +2h", "the goal ended: stopped by
# …"). Only there: what follows (a stop reason, an agent's output) may hold id-like words (UNET3,
# slack:U0DAN) that must not ping anyone. A bare id needs a digit, so that UPDATED stays a word.
_LEADING_ACTOR = re.compile(
    r"^((?:the goal ended: )?(?:(?:stopped|paused|resumed|approved|rejected) by )?)"
    r"(?:slack:([UW][A-Z0-9]{2,})|(?<= by )([UW](?=[A-Z0-9]*[0-9])[A-Z0-9]{4,}))"
    r"(?: via [^\s()]+ \(uid \d+\))?(?=$|[\s:;,.)])"
)
# A person as Slack sends them in what someone typed (`<@U123>`, `<@U123|ana>`).
_TYPED_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
# An actor as the bot and the runner write them anywhere in an audit detail ("request #1 by slack:U1").
_ACTOR_IN_TEXT = re.compile(r"\bslack:([UW][A-Z0-9]{2,})(?:(?: \([^()]*\))? via [^\s()]+ \(uid \d+\))?")


# The names the runner now records people by ("stopped by Alice"): Slack users the bot has looked
# up (bot/people.py), name -> id, so that Slack shows them as mentions again. A name two people
# share maps to None and stays plain text.
KNOWN_NAMES: dict[str, str | None] = {}
_LEADING_VERB = re.compile(r"^((?:the goal ended: )?(?:(?:stopped|paused|resumed|approved|rejected) by )?)")


def learn_name(name: str, user: str) -> None:
    """`name` is how the runner names Slack user `user` (from users.info)."""
    known = KNOWN_NAMES.get(name, user)
    KNOWN_NAMES[name] = user if known == user else None


def slack_user(who: str | None) -> str | None:
    """The Slack user id a recorded actor names (`U123`, `slack:U123`, `slack:U123 via … (uid N)`,
    or a name the bot looked up); None for anyone else (a CLI operator, the bot itself)."""
    match = _ACTOR.fullmatch((who or "").strip())
    return match.group(1) if match else KNOWN_NAMES.get((who or "").strip())


def _leading_name(escaped: str) -> str:
    """A known person's name where runner-written text names who acted ("stopped by Alice: …",
    "Alice: deadline +2h"), as a mention (the text is already escaped)."""
    head = _LEADING_VERB.match(escaped)
    start = head.end() if head else 0
    for name in sorted((n for n, u in KNOWN_NAMES.items() if u), key=len, reverse=True):
        said = escape(name)
        rest = escaped[start + len(said) :]
        if escaped.startswith(said, start) and (not rest or rest[0] in " :;,.)"):
            return f"{escaped[:start]}<@{KNOWN_NAMES[name]}>{rest}"
    return escaped


def user_ref(who: str | None) -> str:
    """A person as Slack shows them: a Slack user as a mention, anyone else as plain text."""
    if not who:
        return "someone"
    if user := slack_user(who):
        return f"<@{user}>"
    return escape(who)


def people(text: str, *, typed: bool = False) -> str:
    """Text the runner wrote ("stopped by slack:U123 via goaltender-bot (uid 0): enough"),
    mrkdwn-escaped, with the person it records as acting (at its start) as a mention.

    `typed`: text only people and the bot wrote (an audit detail: "'stop now, <@U2>': refused",
    "request #1 by slack:U1"), where every `slack:U…` and every @-mention a person typed is a
    mention. Never for what agents write: that is escape()d only, so nothing in it pings anyone."""
    if not typed:
        said, found = _LEADING_ACTOR.subn(lambda m: f"{m[1]}<@{m[2] or m[3]}>", escape(text), count=1)
        return said if found else _leading_name(said)
    parts = _TYPED_MENTION.split(text)
    # split() puts the mentioned ids at odd positions
    return "".join(
        f"<@{part}>" if i % 2 else _ACTOR_IN_TEXT.sub(r"<@\1>", escape(part)) for i, part in enumerate(parts)
    )


def _inline(text: str) -> str:
    text = re.sub(r"\*\*(.+?)\*\*", r"*\1*", text)
    text = re.sub(r"__(.+?)__", r"*\1*", text)
    text = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r"<\2|\1>", text)
    return text


def markdown_to_mrkdwn(md: str) -> str:
    """Markdown (as the runner writes reports) -> Slack mrkdwn: headings and **bold** become *bold*,
    [text](url) becomes <url|text>, tables and fenced code go into code blocks."""
    out: list[str] = []
    table: list[str] = []
    in_code = False

    def flush_table() -> None:
        if table:
            out.append("```\n" + "\n".join(table) + "\n```")
            table.clear()

    for raw in escape(md.replace("\r\n", "\n")).split("\n"):
        line = raw.rstrip()
        if line.strip().startswith("```"):
            flush_table()
            in_code = not in_code
            out.append("```")
            continue
        if in_code:
            out.append(line)
            continue
        if line.lstrip().startswith("|"):
            table.append(line.strip())
            continue
        flush_table()
        if m := re.match(r"^\s*#{1,6}\s+(.*)$", line):
            out.append(f"*{_inline(m.group(1)).strip('*')}*")
        elif m := re.match(r"^(\s*)[-*+]\s+(.*)$", line):
            out.append(f"{m.group(1)}• {_inline(m.group(2))}")
        else:
            out.append(_inline(line))
    flush_table()
    if in_code:
        out.append("```")
    return "\n".join(out).strip("\n")


def _split(text: str, limit: int = SECTION_MAX) -> list[str]:
    """Split text into pieces of at most `limit` characters, at line breaks where possible, keeping
    ``` code blocks balanced in every piece."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    in_code = False
    for line in text.split("\n"):
        while len(line) > limit - 10:  # a single overlong line: cut it hard
            head, line = line[: limit - 10], line[limit - 10 :]
            if current:
                pieces.append(_close("\n".join(current), in_code))
                current, size = (["```"] if in_code else []), (4 if in_code else 0)
            pieces.append(head)
        if size + len(line) + 1 > limit - 4 and current:
            pieces.append(_close("\n".join(current), in_code))
            current, size = (["```"] if in_code else []), (4 if in_code else 0)
        current.append(line)
        size += len(line) + 1
        if line.strip().startswith("```"):
            in_code = not in_code
    if current and "\n".join(current).strip() not in ("", "```"):
        pieces.append("\n".join(current))
    return [p for p in pieces if p.strip()]


def _close(text: str, in_code: bool) -> str:
    return text + "\n```" if in_code else text


def section(text: str) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:SECTION_MAX] or " "}}


def sections(text: str) -> list[dict]:
    return [section(piece) for piece in _split(text)]


def context(text: str) -> dict:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:SECTION_MAX] or " "}]}


def block_chars(block: dict) -> int:
    if "text" in block and isinstance(block["text"], dict):
        return len(block["text"].get("text", ""))
    return sum(len(el.get("text", "")) for el in block.get("elements", []) if isinstance(el, dict))


def fit(
    blocks: list[dict],
    what: str = "message",
    *,
    max_blocks: int = MAX_BLOCKS,
    max_chars: int = MAX_TOTAL,
    full: str = "`goaltender summary <goal>`",
) -> list[dict]:
    """At most `max_blocks` blocks and `max_chars` characters; anything cut is noted at the end
    (the note is one of the blocks), saying where the full text is (`full`)."""
    kept: list[dict] = []
    total = 0
    for i, block in enumerate(blocks):
        chars = block_chars(block)
        if len(kept) >= max_blocks - 1 or total + chars > max_chars:
            cut = len(blocks) - i
            kept.append(
                context(
                    f":scissors: {what} truncated here ({cut} more part{'s' if cut != 1 else ''} not shown; "
                    f"the full text is on the runner: {full})"
                )
            )
            return kept
        kept.append(block)
        total += chars
    return kept


def payload(text: str, blocks: list[dict], what: str = "message") -> Payload:
    """`text` is the notification text, which Slack parses as it does blocks: mrkdwn built as the
    blocks are (escape() on what people and agents wrote, user_ref() / people() for people)."""
    return {"text": cut(text, FALLBACK_MAX), "blocks": fit(blocks, what)}


def cut(text: str, limit: int) -> str:
    """At most `limit` characters, never ending inside an entity (`&am`) or a mention (`<@U1`)."""
    if len(text) <= limit:
        return text
    return re.sub(r"(?:&[a-z]*|<[^>]*)$", "", text[: limit - 1]) + "…"
