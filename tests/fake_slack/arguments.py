"""The checks Slack makes on Web API arguments: channels (exists, bot a member, not archived), the
content of a message (text, markdown_text, blocks), metadata, thread_ts, and whose message it is."""

from __future__ import annotations

import json
import re
from typing import Any

from .blocks import _validate_blocks, _with_block_ids
from .records import Channel, Message, SlackError

MAX_TEXT = 40_000
_TS_RE = re.compile(r"^\d+\.\d+$")


class Arguments:
    """Mixed into FakeSlack (uses its channels, files and warnings)."""

    def _api_channel(self, value: Any) -> Channel:
        if not value or not isinstance(value, str):
            raise SlackError("channel_not_found")
        try:
            return self.channel(value)
        except KeyError:
            raise SlackError("channel_not_found") from None

    def _writable_channel(self, value: Any) -> Channel:
        ch = self._api_channel(value)
        if ch.is_archived:
            raise SlackError("is_archived")
        if self.bot_user_id not in ch.members:
            raise SlackError("not_in_channel")
        return ch

    def _readable_channel(self, value: Any) -> Channel:
        ch = self._api_channel(value)
        if self.bot_user_id not in ch.members:
            raise SlackError("not_in_channel")
        return ch

    def _parse_blocks(self, raw: Any) -> list[dict]:
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raise SlackError("invalid_blocks_format") from None
        if not isinstance(raw, list):
            raise SlackError("invalid_blocks_format")
        errors = _validate_blocks(raw, self._file_is_shared)
        if errors:
            raise SlackError(
                "invalid_blocks",
                errors=errors,
                response_metadata={"messages": [f"[ERROR] {e}" for e in errors]},
            )
        return raw

    def _file_is_shared(self, slack_file: dict) -> bool:
        fid = slack_file.get("id")
        url = slack_file.get("url")
        for f in self.files.values():
            obj = self._file_object(f, with_shares=False)
            if fid == f.id or url in (obj["url_private"], obj["permalink"]):
                return bool(f.shares)
        return False

    def _content(self, p: dict[str, Any], *, required: bool = True) -> tuple[str, list[dict] | None]:
        text = p.get("text")
        text = "" if text is None else str(text)
        markdown_text = p.get("markdown_text")
        blocks = self._parse_blocks(p["blocks"]) if p.get("blocks") not in (None, "") else None
        attachments = p.get("attachments")
        if markdown_text:
            if text or blocks:
                raise SlackError("markdown_text_conflict")
            if len(markdown_text) > 12_000:
                raise SlackError("msg_too_long")
            text = str(markdown_text)
        if required and not text and not blocks and not attachments:
            raise SlackError("no_text")
        if len(text) > MAX_TEXT:
            raise SlackError("msg_too_long")
        if blocks and not text:
            self.warnings.append("blocks sent without a text fallback (notifications will be empty)")
        return text, (_with_block_ids(blocks) if blocks else blocks)

    @staticmethod
    def _metadata(raw: Any) -> dict | None:
        if raw in (None, ""):
            return None
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raise SlackError("invalid_metadata_format") from None
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("event_type"), str)
            or not raw["event_type"]
            or not isinstance(raw.get("event_payload", {}), dict)
        ):
            raise SlackError("invalid_metadata_format")
        return {"event_type": raw["event_type"], "event_payload": raw.get("event_payload", {})}

    @staticmethod
    def _thread_ts(raw: Any) -> str | None:
        if raw is None:
            return None
        value = str(raw)
        if not _TS_RE.match(value) or float(value) <= 0:
            raise SlackError(
                "invalid_thread_ts",
                response_metadata={"messages": [f"[ERROR] {value} is not a valid thread_ts"]},
            )
        return value

    def _own_message(self, ch: Channel, ts: Any, error: str) -> Message:
        msg = ch.find(str(ts)) if ts else None
        if msg is None:
            raise SlackError("message_not_found")
        if msg.bot_id != self.bot_id:
            raise SlackError(error)
        return msg


def _ts_key(ts: str) -> tuple[int, int]:
    sec, _, frac = ts.partition(".")
    return int(sec or 0), int((frac + "000000")[:6])


def _truthy(value: Any) -> bool:
    return value is True or value == 1 or (isinstance(value, str) and value.lower() in ("1", "true"))
