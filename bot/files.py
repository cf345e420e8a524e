"""Files people attach in a goal's thread, given to the goal: a PDF or a text file (a paper, a
dataset card, notes) lands in the goal's workspace, `inputs/`, and its agent is told in its inbox.

Slash commands carry no files, so a file comes with a message in the goal's thread (a
`file_share` message event). The bot asks Slack about it (files.info: its size, before any byte is
fetched), downloads it with its own token (url_private_download; the files:read scope), checks
what it is by its first bytes, not by its name (PDF: `%PDF-`; text: UTF-8 without NUL bytes), and
sends it to the runner in PutInput chunks. The runner makes the name safe and holds the size to
its own cap again (runner/inputs.py). Whatever is refused gets one line in the thread saying why.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from goaltender.bot import render
from goaltender.bot.links import RunnerPool, UnknownRunner
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerUnavailable
from goaltender.storage.bot_store import Thread

log = logging.getLogger("goaltender.bot")

TEXT_NAMES = (
    ".txt",
    ".md",
    ".markdown",
    ".rst",
    ".csv",
    ".tsv",
    ".json",
    ".jsonl",
    ".yaml",
    ".yml",
    ".tex",
    ".bib",
    ".py",
)
KINDS = "a PDF or a text file (.txt, .md, .csv, .json, .tex, …)"


class FileRefused(Exception):
    """A file that is not given to the goal; the message says why, in a line."""


@dataclass(frozen=True)
class Given:
    """A file the goal now has: its name in the thread, and its path in the goal's workspace."""

    name: str
    path: str


def plain_name(name: str) -> str:
    """`name` when it is a plain file name; FileRefused when it names folders (`../x`, `a/b`),
    is hidden (`.x`), or holds control characters."""
    if not name or "/" in name or "\\" in name or name.startswith(".") or any(ord(c) < 32 for c in name):
        raise FileRefused(
            f"`{render.escape(name[:80])}` is not a plain file name; rename it and attach it again"
        )
    return name


def kind_of(name: str, data: bytes) -> str:
    """What the bytes are ("application/pdf", "text/plain"), by their first bytes; FileRefused for
    anything else, or for a name that claims what the bytes are not."""
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    if name.lower().endswith(".pdf"):
        raise FileRefused(
            f"`{render.escape(name)}` is named a PDF but is not one (it does not start with %PDF-)"
        )
    if b"\0" not in data:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return "text/plain"
    raise FileRefused(f"`{render.escape(name)}` is neither a PDF nor text; a goal takes {KINDS}")


class Files:
    """Takes the files attached in goals' threads into the goals' inputs/."""

    def __init__(self, client: AsyncWebClient, pool: RunnerPool, max_bytes: int):
        self.client = client
        self.pool = pool
        self.max_bytes = max_bytes

    async def give(self, thread: Thread, file: dict[str, Any], by: p.Person) -> Given:
        """Give one attached file (a message event's file object) to the thread's goal;
        FileRefused says why not."""
        said = str(file.get("name") or file.get("title") or file.get("id") or "")
        info = await self._info(str(file.get("id") or ""), said)  # (events may carry the id alone)
        name = plain_name(str(file.get("name") or info.get("name") or ""))
        size = int(info.get("size") or 0)
        if size > self.max_bytes:
            raise FileRefused(
                f"`{render.escape(name)}` is {_mb(size)}; goals take files up to {_mb(self.max_bytes)} "
                "(GOALTENDER_MAX_FILE_MB)"
            )
        data = await self._download(info, name)
        mimetype = kind_of(name, data)
        path = await self._send(thread, name, data, mimetype, by)
        return Given(name, path)

    async def _info(self, file_id: str, name: str) -> dict[str, Any]:
        try:
            return (await self.client.files_info(file=file_id)).get("file") or {}
        except SlackApiError as exc:
            error = exc.response.get("error")
            hint = (
                " (the app needs the files:read scope: reinstall it from manifest.yml)"
                if error == "missing_scope"
                else ""
            )
            raise FileRefused(f"Slack would not give me `{render.escape(name)}`: {error}{hint}") from None

    async def _download(self, info: dict[str, Any], name: str) -> bytes:
        """The file's bytes, with the bot's token; at most max_bytes (Slack's size may be stale)."""
        url = info.get("url_private_download") or info.get("url_private")
        if not url or self.client.session is None:
            raise FileRefused(f"Slack gave no download link for `{render.escape(name)}`")
        headers = {"Authorization": f"Bearer {self.client.token}"}
        try:
            async with self.client.session.get(url, headers=headers, allow_redirects=False) as response:
                if response.status != 200:
                    raise FileRefused(
                        f"downloading `{render.escape(name)}` from Slack failed (HTTP {response.status})"
                    )
                data = bytearray()
                async for chunk in response.content.iter_chunked(64 * 1024):
                    data += chunk
                    if len(data) > self.max_bytes:
                        break  # over the cap: no need for the rest
        except aiohttp.ClientError as exc:
            raise FileRefused(f"downloading `{render.escape(name)}` from Slack failed ({exc})") from None
        if len(data) > self.max_bytes:
            raise FileRefused(
                f"`{render.escape(name)}` is over {_mb(self.max_bytes)} (GOALTENDER_MAX_FILE_MB)"
            )
        if not data:
            raise FileRefused(f"`{render.escape(name)}` is empty")
        return bytes(data)

    async def _send(self, thread: Thread, name: str, data: bytes, mimetype: str, by: p.Person) -> str:
        """The file to the runner, a chunk a request; its path in the goal's workspace."""
        try:
            link = self.pool[thread.runner]
            done = p.Done()
            for offset in range(0, len(data), p.INPUT_CHUNK):
                chunk = data[offset : offset + p.INPUT_CHUNK]
                done = await link.request(
                    p.PutInput(
                        goal_id=thread.goal_id,
                        name=name,
                        size=len(data),
                        offset=offset,
                        data=base64.b64encode(chunk).decode(),
                        last=offset + len(chunk) >= len(data),
                        mimetype=mimetype,
                        by=by,
                    )
                )
        except p.ProtocolError as exc:
            raise FileRefused(
                f"the runner refused `{render.escape(name)}`: {render.escape(exc.error.message)}"
            ) from None
        except (RunnerUnavailable, UnknownRunner) as exc:
            raise FileRefused(
                f"runner {thread.runner} is not reachable ({render.escape(str(exc))}); attach `{render.escape(name)}` again later"
            ) from None
        return done.message


def _mb(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB"
