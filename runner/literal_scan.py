"""Does a block of bytes hold any of many byte strings? One Hyperscan pass (several GB/s), where
the `hyperscan` wheel is installed and the CPU runs it; `LiteralScanner.of` is None elsewhere, and
the caller searches its own way (runner/secrets.py: str search, shared pieces first).

Block mode, stopping at the first match: the answer is yes or no, never where.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

try:
    import hyperscan
except ImportError:  # not on this platform (no wheel): callers fall back to their own search
    hyperscan = None  # type: ignore[assignment]

log = logging.getLogger("goaltender.runner")


def _database(expressions: list[bytes], *, literal: bool) -> Any:
    """A compiled Hyperscan block-mode database that stops at a block's first match."""
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(
        expressions=expressions,
        ids=list(range(len(expressions))),
        flags=hyperscan.HS_FLAG_SINGLEMATCH,
        literal=literal,
    )
    return database


class LiteralScanner:
    """Hyperscan over a set of byte strings (or expressions): does a block hold any of them?"""

    def __init__(self, database: Any):
        self._database = database
        self._scratch = threading.local()  # a scan's scratch space is used by one thread at a time

    @classmethod
    def of(cls, needles: Iterable[bytes]) -> LiteralScanner | None:
        """A scanner for `needles`, or None where Hyperscan is not installed or cannot run here."""
        if hyperscan is None:
            return None
        literals = sorted(set(needles))
        # As patterns of escaped bytes: Hyperscan's regex compiler scans a set of literals faster
        # (4.9 GB/s on a training log here) than its literal compiler does (3.2); the literal one
        # is the fallback, for a needle the regex compiler will not take.
        patterns = [b"".join(b"\\x%02x" % byte for byte in literal) for literal in literals]
        error: Exception | None = None
        for expressions, literal in ((patterns, False), (literals, True)):
            try:
                return cls(_database(expressions, literal=literal))
            except hyperscan.HyperscanError as exc:  # e.g. a CPU without the instructions it needs
                error = exc
        log.warning("Hyperscan cannot compile %d needles (%s); using str search", len(literals), error)
        return None

    @classmethod
    def of_expressions(cls, expressions: list[bytes]) -> LiteralScanner | None:
        """A scanner for regular expressions (Hyperscan's dialect), or None as `of` says."""
        if hyperscan is None:
            return None
        try:
            return cls(_database(expressions, literal=False))
        except hyperscan.HyperscanError as exc:
            log.warning("Hyperscan cannot compile %d expressions (%s); using re", len(expressions), exc)
            return None

    def finds_any(self, data: bytes) -> bool:
        scratch = getattr(self._scratch, "space", None)
        if scratch is None:
            scratch = self._scratch.space = hyperscan.Scratch(self._database)
        try:
            self._database.scan(data, match_event_handler=_stop_at_first, scratch=scratch)
        except hyperscan.ScanTerminated:
            return True
        return False


def _stop_at_first(*match: object) -> bool:
    return True  # a true answer ends the scan: one match is enough
