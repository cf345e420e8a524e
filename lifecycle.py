"""`goaltender backup`, `restore` and `prune`: keeping runner.db and bot.db over months.

The two databases live where their settings say: runner.db in GOALTENDER_HOME (the runner's),
bot.db at GOALTENDER_DB or in the same home (the bot's). A box runs the runner, the bot or both;
each verb does what it finds there. How the copies are made and put back is storage/backup.py;
what retention removes is storage/pruning.py (runner.db) and bot/pruning.py (bot.db).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from goaltender.bot.config import BotSettings
from goaltender.runner.config import RunnerSettings
from goaltender.storage.backup import (
    RestoreRefused,
    backup_database,
    kind_of,
    processes_with_open,
    put_back,
    runner_facts,
    runner_stopped,
    stamp,
)
from goaltender.storage.db import private_directory
from goaltender.storage.high_water import FILE as HIGH_WATER_FILE
from goaltender.storage.high_water import HighWater
from goaltender.storage.pruning import size_text
from goaltender.storage.runner_schema import MIGRATIONS as RUNNER_MIGRATIONS

BACKUP_DIR = "backups"  # under the home, unless --to names another


class NothingThere(Exception):
    """Neither database is on this box; the message says where they were looked for."""


def databases() -> dict[str, Path]:
    """Where this box keeps runner.db and bot.db, whether or not they exist."""
    return {"runner": RunnerSettings().db_path, "bot": BotSettings().db_path}


def backup(to: Path | None) -> list[str]:
    """Copy each database there is into a new directory `<to>/<time>`; the lines say what was
    written. NothingThere when neither exists."""
    found = {kind: path for kind, path in databases().items() if path.is_file()}
    if not found:
        raise NothingThere(f"nothing to back up: no {' and no '.join(str(p) for p in databases().values())}")
    target = (to or RunnerSettings().home / BACKUP_DIR) / stamp()
    private_directory(target.parent, tighten=False)
    target.mkdir(mode=0o700)  # a new one every time: a backup never writes over another
    said = []
    for kind, path in found.items():
        copied = backup_database(path, target / path.name)
        identity = f", database {runner_facts(copied.target)['runner_id']}" if kind == "runner" else ""
        said.append(f"wrote {copied.target}: {size_text(copied.bytes)} (from {path}{identity})")
    return said


def restore(source: Path, only: str | None = None) -> list[str]:
    """Put the backup `source` (a directory `backup` made, or one .db file) back in place, with
    its program stopped; the lines say what was done and what comes next."""
    copies = _copies_in(source, only)
    where = databases()
    said: list[str] = []
    when = stamp()
    for kind, copy in copies.items():
        said += (_restore_runner if kind == "runner" else _restore_bot)(copy, where[kind], when)
    return said


def _copies_in(source: Path, only: str | None) -> dict[str, Path]:
    if source.is_dir():
        files = [source / name for name in ("runner.db", "bot.db") if (source / name).is_file()]
    elif source.is_file():
        files = [source]
    else:
        raise RestoreRefused(f"{source} does not exist")
    copies: dict[str, Path] = {}
    for file in files:
        try:
            copies[kind_of(file)] = file
        except ValueError as exc:
            raise RestoreRefused(str(exc)) from None
    if only is not None:
        copies = {kind: file for kind, file in copies.items() if kind == only}
    if not copies:
        what = f"{only}.db" if only else "runner.db or bot.db"
        raise RestoreRefused(f"no {what} to restore in {source}{_newest_backup_in(source)}")
    return copies


def _newest_backup_in(source: Path) -> str:
    """A hint when `source` holds the dated directories `backup` writes, not the databases."""
    dated = sorted(path for path in source.glob("*/*.db") if path.parent.is_dir()) if source.is_dir() else []
    return f" (name one of the backups in it, such as {dated[-1].parent})" if dated else ""


def _restore_runner(copy: Path, path: Path, when: str) -> list[str]:
    home = path.parent
    facts = runner_facts(copy)
    if int(facts["schema"]) > len(RUNNER_MIGRATIONS):
        raise RestoreRefused(
            f"{copy} is from a newer goaltender (schema version {facts['schema']}; this one knows up to "
            f"{len(RUNNER_MIGRATIONS)}): restore it with that version"
        )
    with runner_stopped(home):
        before = _identity_of(path)
        aside = put_back(copy, path, when)
        said = [
            f"restored {path} from {copy}: database {facts['runner_id']}, {facts['goals']} goals "
            f"(the last #{facts['last_goal']}), events up to {facts['last_seq']}"
        ]
        if aside:
            said.append(f"set aside what was there: {', '.join(str(p) for p in aside)}")
        marker = RunnerSettings().lost_marker
        if marker.exists():
            marker.unlink()
            said.append(f"removed {marker}: the runner had stopped because runner.db was lost")
    marks = HighWater(home / HIGH_WATER_FILE).marks
    if before is not None and before != facts["runner_id"]:
        said.append(
            f"this is another database than the one that was there ({before}): in Slack its goals "
            "get threads of their own"
        )
    said.append(
        "next: start the runner (systemctl start goaltender-runner). Its goals resume where the backup "
        f"left them. New goals are numbered above #{max(marks.goal, int(facts['last_goal']))} and events "
        f"above {max(marks.seq, int(facts['last_seq']))} ({HIGH_WATER_FILE} keeps the highest this home "
        "handed out), so nothing made after the backup is numbered again; the bot goes on from where the "
        "restored log ends, by itself."
    )
    return said


def _identity_of(path: Path) -> str | None:
    try:
        return str(runner_facts(path)["runner_id"]) if path.is_file() else None
    except Exception:  # damaged or unreadable: what is being replaced need not be read
        return None


def _restore_bot(copy: Path, path: Path, when: str) -> list[str]:
    if holders := processes_with_open(path):
        raise RestoreRefused(
            f"the bot has {path} open (pid {', '.join(map(str, holders))}): stop it first "
            "(systemctl stop goaltender-bot), then restore"
        )
    aside = put_back(copy, path, when)
    said = [f"restored {path} from {copy}"]
    if aside:
        said.append(f"set aside what was there: {', '.join(str(p) for p in aside)}")
    said.append(
        "next: start the bot (systemctl start goaltender-bot). It reads each runner's events from "
        "where the backup had read them: what it posted after the backup may be posted again."
    )
    return said


def prune_locally(kind: str, days: int | None, dry_run: bool) -> list[str]:
    """Prune one database opened here: bot.db (whoever else has it open), or runner.db with no
    runner on it (a running runner is asked instead: another process writing its file stops it)."""
    path = databases()[kind]
    if not path.is_file():
        return [f"{path}: none here, nothing to prune"]
    if kind == "bot":
        return asyncio.run(_prune_bot(path, days or BotSettings().retention_days, dry_run))
    with runner_stopped(path.parent, doing="prune"):
        return asyncio.run(_prune_runner(path, days or RunnerSettings().retention_days, dry_run))


async def _prune_bot(path: Path, days: int, dry_run: bool) -> list[str]:
    from goaltender.bot.pruning import prune_bot
    from goaltender.storage.bot_store import BotStore

    if not days:
        return [f"{path}: retention is off (GOALTENDER_RETENTION_DAYS=0); name --days to prune once"]
    store = await BotStore.open(path)
    try:
        return (await prune_bot(store, days, dry_run=dry_run)).lines(str(path))
    finally:
        await store.close()


async def _prune_runner(path: Path, days: int, dry_run: bool) -> list[str]:
    from goaltender.storage.pruning import prune_runner
    from goaltender.storage.runner_store import RunnerStore

    if not days:
        return [f"{path}: retention is off (GOALTENDER_RETENTION_DAYS=0); name --days to prune once"]
    store = await RunnerStore.open(path)
    try:
        return (await prune_runner(store, days, dry_run=dry_run)).lines(str(path))
    finally:
        with contextlib.suppress(Exception):
            await store.close()
