"""What the runner and the bot tell systemd about their life (sd_notify): READY=1 once they serve,
STOPPING=1 when they begin to shut down, and a STATUS= line that `systemctl status` shows.

A service of Type=notify counts as started only at READY=1, so `systemctl start` (and whatever is
ordered after it: the bot after the runner) waits until the socket answers or Slack is connected,
and a start that fails is a failed start, not a service that died later. Without systemd (no
NOTIFY_SOCKET) nothing is sent.

The datagrams go through sdnotify, a pure-Python client of the protocol. NOTIFY_SOCKET is taken
out of the environment as this module is imported (as sd_notify(3)'s unset_environment does):
the agents and runs the runner starts inherit its environment, and systemd takes notes from the
main process only (NotifyAccess=main).
"""

from __future__ import annotations

import os

import sdnotify


def _connect() -> sdnotify.SystemdNotifier | None:
    """The connection to systemd's notification socket; None without one."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return None
    notifier = sdnotify.SystemdNotifier()  # connects to $NOTIFY_SOCKET now
    del os.environ["NOTIFY_SOCKET"]
    return notifier


# As the runner or the bot imports this module, before either starts a process of its own.
_systemd = _connect()


def _tell(*lines: str) -> None:
    if _systemd is not None:
        _systemd.notify("\n".join(lines))  # one datagram: systemd reads its lines together


def ready(status: str) -> None:
    """The service serves now: `systemctl start` returns, and units ordered after it start."""
    _tell("READY=1", f"STATUS={_one_line(status)}")


def stopping(status: str) -> None:
    """The service has begun to shut down (a SIGTERM): `systemctl status` says so meanwhile."""
    _tell("STOPPING=1", f"STATUS={_one_line(status)}")


def _one_line(text: str) -> str:
    return " ".join(text.split())
