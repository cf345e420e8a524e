"""One aiosqlite connection per process: WAL, a busy timeout, `BEGIN IMMEDIATE` for every write,
migrations keyed on `PRAGMA user_version`.

A database opened with `watch` (runner.db) checks before and after every write that its files are
still the ones it opened (storage/db_files.py): once one is removed or replaced, no write begins,
and none that committed into the lost file is acknowledged; `on_lost` hears it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from goaltender.storage.db_files import FileWatch, Lost, Rescued, rescue

BUSY_TIMEOUT_MS = 10_000
LOCKED_RETRY_S = 1.0  # between tries of a write that found the database locked past the busy timeout

log = logging.getLogger("goaltender.storage")
PRIVATE_FILE = 0o600  # a database and its -wal and -shm: only this user reads them
PRIVATE_DIR = 0o700


def private_directory(path: Path, *, tighten: bool = True) -> Path:
    """Create `path` (and missing parents) as 0700 whatever the umask; `tighten` makes an existing
    `path` 0700 too (for directories that are ours alone, like the runner's home)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    for each in [path, *missing] if tighten else missing:
        os.chmod(each, PRIVATE_DIR)
    return path


def private_file(path: Path) -> None:
    """Make `path` 0600, creating it empty if missing (umask-independent)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE))
    os.chmod(path, PRIVATE_FILE)


class UnusableDatabase(sqlite3.DatabaseError):
    """The file cannot be used as it is; the message says what to do."""


class NewerDatabase(UnusableDatabase):
    """The file's schema is newer than this code's migrations."""


class DamagedDatabase(UnusableDatabase):
    """SQLite's quick_check finds the file damaged past its header."""


class DatabaseLost(UnusableDatabase):
    """The database file (or its -wal or -shm) was removed or replaced while open: nothing more is
    written, and a write that committed into the lost file is not acknowledged."""

    def __init__(self, lost: Lost):
        super().__init__(f"{lost} while in use; nothing more is written to it")
        self.lost = lost


# Connections let go of without closing them (closing would checkpoint into a file that is not
# theirs any more: storage/db_files.py); kept here so that they are not closed when collected.
_LET_GO: list[Any] = []


def let_go_of_any() -> bool:
    """Whether this process let go of a connection: then it must end with os._exit, for a normal
    exit closes that connection, and closing checkpoints into a file that is not its own."""
    return bool(_LET_GO)


class Database:
    """A SQLite file opened for one process.

    Writes are serialised inside the process by a lock and across processes by `BEGIN IMMEDIATE`
    (which, unlike a deferred `BEGIN`, honours the busy timeout when another process holds the lock).
    """

    def __init__(self, conn: aiosqlite.Connection, path: Path):
        self.conn = conn
        self.path = path
        self._write_lock = asyncio.Lock()
        self._watch: FileWatch | None = None
        self.lost: Lost | None = None
        """What became of the database's files, once a check found it (then nothing is written)."""
        self.on_lost: Callable[[Lost], None] = lambda lost: None
        self._let_go: Rescued | None = None  # what let_go did, once it has

    @classmethod
    async def open(cls, path: str | Path, migrations: Sequence[str] = (), *, watch: bool = False) -> Database:
        """Open (creating it if missing) and migrate. `watch`: check the files before and after each
        write, and on `check_files` (see the module)."""
        path = Path(path)
        private_directory(path.parent, tighten=False)
        private_file(path)  # SQLite gives -wal and -shm the database's mode when it creates them
        conn = await aiosqlite.connect(path, isolation_level=None)
        db = cls(conn, path)
        try:
            await db._prepare(migrations)
        except BaseException:
            # The connection's thread is not a daemon: left open, it keeps the process from exiting.
            await conn.close()
            raise
        if watch:
            db._watch = FileWatch(path)
        return db

    async def _prepare(self, migrations: Sequence[str]) -> None:
        self.conn.row_factory = sqlite3.Row
        await self.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        await self.conn.execute("PRAGMA journal_mode=WAL")
        await self.conn.execute("PRAGMA synchronous=NORMAL")
        await self.conn.execute("PRAGMA foreign_keys=ON")
        for sidecar in ("-wal", "-shm"):  # left by an older version, or made under another umask
            with contextlib.suppress(FileNotFoundError):
                os.chmod(f"{self.path}{sidecar}", PRIVATE_FILE)
        await self._check()
        await self.migrate(migrations)

    async def _check(self) -> None:
        """A file damaged deeper than its header opens, and fails later, where a page of it is read
        (`database disk image is malformed` from a status). Checked once as it opens: ~1 s a GB."""
        async with self.conn.execute("PRAGMA quick_check(3)") as cursor:
            found = [row[0] for row in await cursor.fetchall()]
        if found != ["ok"]:
            raise DamagedDatabase(
                f"{self.path} is damaged ({'; '.join(found)}): restore it from a backup, or salvage what "
                f"is left with `sqlite3 {self.path} .recover | sqlite3 recovered.db` and use that"
            )

    async def close(self) -> None:
        if self.lost is None:
            await self.conn.close()
        elif self._let_go is None:
            await self.let_go()

    def check_files(self) -> Lost | None:
        """Whether the files are lost (a cheap check, for a timer); found once, it stays found. Not
        while a write is under way: its commit may be changing the database file."""
        if self.lost is None and self._watch is not None and not self._write_lock.locked():
            self._found(self._watch.before_write())
        return self.lost

    def _found(self, lost: Lost | None) -> None:
        if lost is not None and self.lost is None:
            self.lost = lost
            self.on_lost(lost)

    def _still_ours(self, look: Callable[[FileWatch], Lost | None]) -> None:
        """Raise DatabaseLost if the files are lost, or `look` finds them so."""
        if self._watch is not None and self.lost is None:
            self._found(look(self._watch))
        if self.lost is not None:
            raise DatabaseLost(self.lost)

    async def let_go(self) -> Rescued:
        """After the files were lost: save what the connection holds, take its -wal and -shm off
        their paths, and stop its thread without closing it (storage/db_files.py). Returns what
        was done."""
        assert self.lost is not None and self._watch is not None
        async with self._write_lock:  # no write is half way through
            if self._let_go is None:
                self._let_go = await rescue(self.conn, self._watch, self.lost)
                # aiosqlite closes its sqlite3 connection as its thread stops, unless it has none.
                _LET_GO.append(self.conn._connection)
                self.conn._connection = None
                if (stopped := self.conn.stop()) is not None:
                    await stopped
        return self._let_go

    async def user_version(self) -> int:
        row = await self.fetchone("PRAGMA user_version")
        return int(row[0]) if row else 0

    async def migrate(self, migrations: Sequence[str]) -> int:
        """Apply migrations[user_version:] in order; each runs in its own transaction.

        Migration N (1-based) moves the file to user_version N. Re-checking the version inside the
        write transaction makes two processes racing to migrate the same file safe. A file of a
        later version (a newer goaltender's) raises NewerDatabase: its rows would not read back.
        """
        if migrations and (found := await self.user_version()) > len(migrations):
            raise NewerDatabase(
                f"{self.path} is from a newer goaltender (schema version {found}; this one knows up to "
                f"{len(migrations)}): run that version, or restore a backup made with this one"
            )
        for number, script in enumerate(migrations, start=1):
            async with self.write() as tx:
                if (await tx.one("PRAGMA user_version"))[0] >= number:
                    continue
                for statement in _split_sql(script):
                    await tx.run(statement)
                # PRAGMA arguments cannot be bound; `number` is an int we generated.
                await tx.run(f"PRAGMA user_version={int(number)}")
        return await self.user_version()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Tx]:
        """`async with db.write() as tx:` runs the block in one `BEGIN IMMEDIATE` transaction.
        Another process holding the write lock past the busy timeout (an operator's `sqlite3`
        shell, say) is waited out: the write begins once the lock goes. It used to fail, and with
        it whatever was being entered (a run's row), leaving a goal running with no agent."""
        async with self._write_lock:
            self._still_ours(FileWatch.before_write)
            await self._begin()
            try:
                yield Tx(self.conn)
                await self.conn.execute("COMMIT")
            except BaseException:
                await self._rollback()
                # A COMMIT whose await was cancelled ran all the same, and may have checkpointed.
                if self._watch is not None:
                    self._found(self._watch.after_commit())
                raise
            # Committed, but into the lost file if it went meanwhile: then not acknowledged.
            self._still_ours(FileWatch.after_commit)

    async def vacuum(self) -> None:
        """Rewrite the file without its free pages (VACUUM), then checkpoint the -wal into it and
        truncate it, so that the space goes back to the disk. Under the write lock, checked like a
        write: it is this connection's own change to the file."""
        async with self._write_lock:
            self._still_ours(FileWatch.before_write)
            try:
                await self.conn.execute("VACUUM")
                await self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                if self._watch is not None:
                    self._found(self._watch.after_commit())
            self._still_ours(FileWatch.after_commit)

    async def _begin(self) -> None:
        said = False
        while True:
            try:
                await self.conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                    raise
                if not said:
                    log.warning("%s is locked by another process; its writes wait for it", self.path)
                    said = True
                await asyncio.sleep(LOCKED_RETRY_S)
                # Not its content: the process holding the lock may be checkpointing into it.
                self._still_ours(lambda watch: watch.after_commit(remember=False))

    async def _rollback(self) -> None:
        """Roll back what is left of a failed transaction. SQLite may have rolled it back already
        (it does on SQLITE_FULL), and a COMMIT that failed leaves it open. Whether it is open is
        known only in the connection's thread: a COMMIT whose await was cancelled still runs there,
        before this ROLLBACK, which then finds nothing to roll back."""
        try:
            await self.conn.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            if "no transaction is active" not in str(exc):
                raise

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one write statement in its own transaction; returns lastrowid."""
        async with self.write() as tx:
            return await tx.insert(sql, params)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return list(await self.conn.execute_fetchall(sql, params))

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row:
        """The first row of a query that always has one (an aggregate, a row known to exist)."""
        return _required(await self.fetchone(sql, params), sql)


class Tx:
    """Statements inside a write transaction; each costs one hop to the connection's thread."""

    def __init__(self, conn: aiosqlite.Connection):
        self.conn = conn

    async def insert(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = await self.conn.execute_insert(sql, params)
        return row[0] if row else 0

    async def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """An UPDATE/DELETE/DDL statement; returns the number of rows changed."""
        cursor = await self.conn.execute(sql, params)
        return cursor.rowcount

    async def run_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self.conn.executemany(sql, rows)

    async def rows(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return list(await self.conn.execute_fetchall(sql, params))

    async def row(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        rows = await self.rows(sql, params)
        return rows[0] if rows else None

    async def one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row:
        """The first row of a query that always has one (an aggregate, a row just written)."""
        return _required(await self.row(sql, params), sql)


def _required(row: sqlite3.Row | None, sql: str) -> sqlite3.Row:
    if row is None:
        raise LookupError(f"no row for {sql!r}")
    return row


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
