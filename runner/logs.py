"""How the runner and the bot log: to stderr, as lines of text (the default), or with
GOALTENDER_LOG_FORMAT=json as one JSON object a line (python-json-logger) for a log shipper:
`time` (ISO 8601, UTC), `level`, `logger`, `message`, `exception` (the traceback, or null), plus
any `extra` a call passed. In JSON, what would otherwise reach stderr as free text goes through
the log too — Python warnings, an uncaught exception, the line a daemon says when it cannot start —
so that every line parses.

Both formats are written to stderr after `redact_output` (runner/secrets.py) has put the redactor
on it, so a secret is replaced the same way in either (the redactor reads JSON's escapes).
"""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType
from typing import Literal

from pythonjsonlogger.json import JsonFormatter

LogFormat = Literal["text", "json"]

RUNNER_TEXT = "%(asctime)s %(name)s %(levelname)s %(message)s"
BOT_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

log = logging.getLogger("goaltender")


def json_formatter() -> JsonFormatter:
    return JsonFormatter(
        "{levelname}{name}{message}{exc_info}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger", "exc_info": "exception"},
        rename_fields_keep_missing=True,  # "exception": null on every line without one
        timestamp="time",
    )


def configure_logging(log_format: LogFormat, text_format: str) -> None:
    """INFO and up to stderr (as it is now: call after redact_output) in `log_format`."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(json_formatter())
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
    else:
        handler.setFormatter(logging.Formatter(text_format))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def say(line: str, log_format: LogFormat) -> None:
    """A line the daemon says on its way out (why it cannot start, why it stopped): as it is in
    text, a log record (level CRITICAL) in JSON."""
    if log_format == "json":
        log.critical(line)
    else:
        print(line, file=sys.stderr)


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    log.critical("uncaught exception", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        name = args.thread.name if args.thread else "a thread"
        log.error(
            "uncaught exception in %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
        )
