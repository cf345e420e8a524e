"""One aiosqlite connection per process: WAL, a busy timeout, `BEGIN IMMEDIATE` for every write,
migrations keyed on `PRAGMA user_version`."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

BUSY_TIMEOUT_MS = 10_000


class Database:
    """A SQLite file opened for one process.

    Writes are serialised inside the process by a lock and across processes by `BEGIN IMMEDIATE`
    (which, unlike a deferred `BEGIN`, honours the busy timeout when another process holds the lock).
    """

    def __init__(self, conn: aiosqlite.Connection, path: Path):
        self.conn = conn
        self.path = path
        self._write_lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: str | Path, migrations: Sequence[str] = ()) -> Database:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(path, isolation_level=None)
        conn.row_factory = sqlite3.Row
        await conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        await conn.execute("PRAGMA foreign_keys=ON")
        db = cls(conn, path)
        await db.migrate(migrations)
        return db

    async def close(self) -> None:
        await self.conn.close()

    async def user_version(self) -> int:
        row = await self.fetchone("PRAGMA user_version")
        return int(row[0]) if row else 0

    async def migrate(self, migrations: Sequence[str]) -> int:
        """Apply migrations[user_version:] in order; each runs in its own transaction.

        Migration N (1-based) moves the file to user_version N. Re-checking the version inside the
        write transaction makes two processes racing to migrate the same file safe.
        """
        for number, script in enumerate(migrations, start=1):
            async with self.write() as conn:
                async with conn.execute("PRAGMA user_version") as cur:
                    row = await cur.fetchone()
                if row[0] >= number:
                    continue
                for statement in _split_sql(script):
                    await conn.execute(statement)
                # PRAGMA arguments cannot be bound; `number` is an int we generated.
                await conn.execute(f"PRAGMA user_version={int(number)}")
        return await self.user_version()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[aiosqlite.Connection]:
        """`async with db.write() as conn:` runs the block in one `BEGIN IMMEDIATE` transaction."""
        async with self._write_lock:
            await self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                await self.conn.execute("ROLLBACK")
                raise
            else:
                await self.conn.execute("COMMIT")

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one write statement in its own transaction; returns lastrowid."""
        async with self.write() as conn, conn.execute(sql, params) as cur:
            return cur.lastrowid or 0

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        async with self.conn.execute(sql, params) as cur:
            return list(await cur.fetchall())

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        async with self.conn.execute(sql, params) as cur:
            return await cur.fetchone()


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (sqlite3 executes one statement per call)."""
    statements, current = [], ""
    for piece in script.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):  # false while a ';' sits inside a string literal
            if current.strip(" \n\t;"):
                statements.append(current.strip())
            current = ""
    return statements
