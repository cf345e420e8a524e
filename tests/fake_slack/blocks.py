"""Block Kit as Slack treats it: validation (Slack's "errors" list with json-pointers), the rich_text
block Slack's clients send for a typed message, block_ids, and the interactive elements of a message."""

from __future__ import annotations

import base64
import copy
import re
import uuid
from collections.abc import Callable
from typing import Any

MAX_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
_MENTION_RE = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
_TEXT_TYPES = ("plain_text", "mrkdwn")
_BLOCK_TYPES = {
    "section",
    "header",
    "divider",
    "actions",
    "context",
    "image",
    "markdown",
    "rich_text",
    "input",
    "file",
    "video",
    "table",
    "call",
    "context_actions",
    "plan",
    "task_card",
}
_ELEMENT_TYPES = {
    "button",
    "image",
    "overflow",
    "datepicker",
    "timepicker",
    "datetimepicker",
    "checkboxes",
    "radio_buttons",
    "plain_text_input",
    "email_text_input",
    "url_text_input",
    "number_input",
    "rich_text_input",
    "file_input",
    "static_select",
    "external_select",
    "users_select",
    "conversations_select",
    "channels_select",
    "multi_static_select",
    "multi_external_select",
    "multi_users_select",
    "multi_conversations_select",
    "multi_channels_select",
    "workflow_button",
    "feedback_buttons",
    "icon_button",
}


def _rich_text(text: str) -> list[dict]:
    """How Slack's clients encode a typed message: one rich_text block, mentions as user elements."""
    elements: list[dict] = []
    pos = 0
    for m in _MENTION_RE.finditer(text):
        if m.start() > pos:
            elements.append({"type": "text", "text": text[pos : m.start()]})
        elements.append({"type": "user", "user_id": m.group(1)})
        pos = m.end()
    if pos < len(text):
        elements.append({"type": "text", "text": text[pos:]})
    block_id = base64.b32encode(uuid.uuid4().bytes).decode()[:5]
    return [
        {
            "type": "rich_text",
            "block_id": block_id,
            "elements": [{"type": "rich_text_section", "elements": elements}],
        }
    ]


def _with_block_ids(blocks: list[dict]) -> list[dict]:
    """Slack assigns a block_id to every block that has none."""
    out = copy.deepcopy(blocks)
    for block in out:
        if isinstance(block, dict) and "block_id" not in block:
            block["block_id"] = base64.b32encode(uuid.uuid4().bytes).decode()[:5]
    return out


def _interactive_elements(blocks: list[dict]) -> list[tuple[dict, dict]]:
    found = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        elements = list(block.get("elements") or []) if block.get("type") == "actions" else []
        if isinstance(block.get("accessory"), dict):
            elements.append(block["accessory"])
        found.extend((block, el) for el in elements if isinstance(el, dict))
    return found


def _check_text(
    obj: Any, ptr: str, errors: list[str], *, max_len: int, plain_only: bool = False, required: bool = True
) -> None:
    if obj is None:
        if required:
            errors.append(f"missing required field: {ptr.rsplit('/', 1)[-1]} [json-pointer:{ptr}]")
        return
    if not isinstance(obj, dict) or obj.get("type") not in _TEXT_TYPES:
        errors.append(f"must provide an object with type plain_text or mrkdwn [json-pointer:{ptr}]")
        return
    if plain_only and obj["type"] != "plain_text":
        errors.append(f"must be a valid enum value [json-pointer:{ptr}/type]")
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        errors.append(f"must be more than 0 characters [json-pointer:{ptr}/text]")
    elif len(text) > max_len:
        errors.append(f"must be less than {max_len + 1} characters [json-pointer:{ptr}/text]")


def _check_len(value: Any, max_len: int, ptr: str, errors: list[str]) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        errors.append(f"must be a string [json-pointer:{ptr}]")
    elif len(value) > max_len:
        errors.append(f"must be less than {max_len + 1} characters [json-pointer:{ptr}]")


def _check_image(obj: dict, ptr: str, errors: list[str], file_is_shared: Callable[[dict], bool]) -> None:
    url, slack_file = obj.get("image_url"), obj.get("slack_file")
    if (url is None) == (slack_file is None):
        errors.append(f"must provide exactly one of image_url or slack_file [json-pointer:{ptr}]")
    _check_len(url, 3000, f"{ptr}/image_url", errors)
    if slack_file is not None:
        if not isinstance(slack_file, dict) or ("id" in slack_file) == ("url" in slack_file):
            errors.append(f"slack_file must have exactly one of id or url [json-pointer:{ptr}/slack_file]")
        elif not file_is_shared(slack_file):
            errors.append(f"invalid slack file [json-pointer:{ptr}/slack_file]")
    if not obj.get("alt_text"):
        errors.append(f"missing required field: alt_text [json-pointer:{ptr}]")
    _check_len(obj.get("alt_text"), 2000, f"{ptr}/alt_text", errors)


def _check_element(
    el: Any, ptr: str, errors: list[str], action_ids: set[str], file_is_shared: Callable[[dict], bool]
) -> None:
    if not isinstance(el, dict) or not isinstance(el.get("type"), str):
        errors.append(f"missing required field: type [json-pointer:{ptr}]")
        return
    kind = el["type"]
    if kind not in _ELEMENT_TYPES:
        errors.append(f"unsupported type: {kind} [json-pointer:{ptr}/type]")
        return
    action_id = el.get("action_id")
    if action_id is not None:
        _check_len(action_id, 255, f"{ptr}/action_id", errors)
        if action_id in action_ids:
            errors.append(f"action_id already exists: {action_id} [json-pointer:{ptr}/action_id]")
        action_ids.add(action_id)
    if kind == "button":
        _check_text(el.get("text"), f"{ptr}/text", errors, max_len=75, plain_only=True)
        _check_len(el.get("value"), 2000, f"{ptr}/value", errors)
        _check_len(el.get("url"), 3000, f"{ptr}/url", errors)
        if el.get("style") not in (None, "primary", "danger"):
            errors.append(f"must be a valid enum value [json-pointer:{ptr}/style]")
        confirm = el.get("confirm")
        if confirm is not None:
            if not isinstance(confirm, dict):
                errors.append(f"must be an object [json-pointer:{ptr}/confirm]")
            else:
                _check_text(
                    confirm.get("title"), f"{ptr}/confirm/title", errors, max_len=100, plain_only=True
                )
                _check_text(confirm.get("text"), f"{ptr}/confirm/text", errors, max_len=300)
                _check_text(
                    confirm.get("confirm"), f"{ptr}/confirm/confirm", errors, max_len=30, plain_only=True
                )
                _check_text(confirm.get("deny"), f"{ptr}/confirm/deny", errors, max_len=30, plain_only=True)
    elif kind == "image":
        _check_image(el, ptr, errors, file_is_shared)


def _validate_blocks(
    blocks: list[Any], file_is_shared: Callable[[dict], bool], max_blocks: int = MAX_BLOCKS
) -> list[str]:
    """Slack's errors for `blocks` (a message holds up to 50, a Home tab view up to 100)."""
    errors: list[str] = []
    if len(blocks) > max_blocks:
        errors.append(f"no more than {max_blocks} items allowed [json-pointer:/blocks]")
    block_ids: set[str] = set()
    for i, block in enumerate(blocks):
        ptr = f"/blocks/{i}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            errors.append(f"missing required field: type [json-pointer:{ptr}]")
            continue
        kind = block["type"]
        if kind not in _BLOCK_TYPES:
            errors.append(f"unsupported type: {kind} [json-pointer:{ptr}/type]")
            continue
        block_id = block.get("block_id")
        if block_id is not None:
            _check_len(block_id, 255, f"{ptr}/block_id", errors)
            if block_id in block_ids:
                errors.append(f"duplicate block_id: {block_id} [json-pointer:{ptr}/block_id]")
            block_ids.add(block_id)
        action_ids: set[str] = set()
        if kind == "section":
            text, fields = block.get("text"), block.get("fields")
            if text is None and not fields:
                errors.append(f"must provide either text or fields [json-pointer:{ptr}]")
            _check_text(text, f"{ptr}/text", errors, max_len=3000, required=False)
            if fields is not None:
                if not isinstance(fields, list) or len(fields) > 10:
                    errors.append(f"no more than 10 items allowed [json-pointer:{ptr}/fields]")
                else:
                    for j, f in enumerate(fields):
                        _check_text(f, f"{ptr}/fields/{j}", errors, max_len=2000)
            if block.get("accessory") is not None:
                _check_element(block["accessory"], f"{ptr}/accessory", errors, action_ids, file_is_shared)
        elif kind == "header":
            _check_text(block.get("text"), f"{ptr}/text", errors, max_len=150, plain_only=True)
        elif kind == "actions":
            elements = block.get("elements")
            if not isinstance(elements, list) or not elements:
                errors.append(f"must provide at least 1 element [json-pointer:{ptr}/elements]")
            elif len(elements) > 25:
                errors.append(f"no more than 25 items allowed [json-pointer:{ptr}/elements]")
            else:
                for j, el in enumerate(elements):
                    _check_element(el, f"{ptr}/elements/{j}", errors, action_ids, file_is_shared)
        elif kind == "context":
            elements = block.get("elements")
            if not isinstance(elements, list) or not elements:
                errors.append(f"must provide at least 1 element [json-pointer:{ptr}/elements]")
            elif len(elements) > 10:
                errors.append(f"no more than 10 items allowed [json-pointer:{ptr}/elements]")
            else:
                for j, el in enumerate(elements):
                    if isinstance(el, dict) and el.get("type") == "image":
                        _check_image(el, f"{ptr}/elements/{j}", errors, file_is_shared)
                    else:
                        _check_text(el, f"{ptr}/elements/{j}", errors, max_len=3000)
        elif kind == "image":
            _check_image(block, ptr, errors, file_is_shared)
            if block.get("title") is not None:
                _check_text(block["title"], f"{ptr}/title", errors, max_len=2000, plain_only=True)
        elif kind == "markdown":
            if not isinstance(block.get("text"), str) or not block["text"]:
                errors.append(f"missing required field: text [json-pointer:{ptr}]")
            else:
                _check_len(block["text"], 12_000, f"{ptr}/text", errors)
        elif kind == "rich_text":
            if not isinstance(block.get("elements"), list):
                errors.append(f"missing required field: elements [json-pointer:{ptr}]")
        elif kind == "input":
            _check_text(block.get("label"), f"{ptr}/label", errors, max_len=2000, plain_only=True)
            if block.get("element") is None:
                errors.append(f"missing required field: element [json-pointer:{ptr}]")
    return errors
