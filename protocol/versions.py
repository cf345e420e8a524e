"""Which protocol versions a runner and a client speak, and what they say when they share none.

A release speaks the protocol versions OLDEST_PROTOCOL_VERSION to PROTOCOL_VERSION. A hello
carries the client's newest (`version`) and, when it speaks older ones too, its oldest (`oldest`);
the runner answers at the newest version both speak (its welcome's `version`), or refuses the
hello with `version_mismatch` and one line naming the side to upgrade, the one whose newest version
is the lower: `runner at protocol 3, bot at 2: upgrade the bot (update goaltender where
the bot runs, then restart it)`. The version goes up only for a change an older peer cannot read;
fields an older peer can do without are added within a version (protocol.Message.added_fields).

Pydantic-free, like protocol/wire.py: the quick client (protocol/quick_client.py) says hello too.
"""

from __future__ import annotations

import re

OLDEST_PROTOCOL_VERSION = 1  # the oldest version this release still speaks
HOW_TO_UPGRADE = {
    "runner": "update goaltender on the runner's box (git pull, then make install, in its checkout), then restart the runner",
    "bot": "update goaltender where the bot runs (git pull, then make install, in its checkout), then restart it",
    "client": "update goaltender where this command runs (git pull, then make install, in its checkout)",
}
# How a runner from before versions were negotiated refused a hello (runner/server.py then).
_OLD_REFUSAL = re.compile(r"runner speaks protocol (\d+), client sent (\d+)")


def agreed(newest: int, oldest: int, ours_newest: int, ours_oldest: int) -> int | None:
    """The newest version two sides speaking `oldest`..`newest` and `ours_oldest`..`ours_newest`
    both speak, None when they share none."""
    version = min(newest, ours_newest)
    return version if version >= max(oldest, ours_oldest) else None


def peer(client: str) -> str:
    """What a hello's client name is, in a mismatch's words: the bot, or another client."""
    return "bot" if "bot" in client.lower() else "client"


def mismatch(runner_version: int, client: str, client_version: int) -> str:
    """The line saying that a runner and a client share no version, and which to upgrade."""
    who = peer(client)
    older = who if client_version < runner_version else "runner"
    return (
        f"runner at protocol {runner_version}, {who} at {client_version}: "
        f"upgrade the {older} ({HOW_TO_UPGRADE[older]})"
    )


def older_runner_version(message: str) -> int | None:
    """The version a runner from before negotiation said it speaks, in its refusal."""
    found = _OLD_REFUSAL.search(message)
    return int(found.group(1)) if found else None
