"""The built-in agent's parts on their own, without a runner or an agent process: the workspace
shell tool (agents/workspace_tools.py: timeouts, background jobs, process groups), tool-output
truncation and secret redaction (agents/tool_output.py), its settings from the environment
(AgentConfig), and compaction of the history into a recap (agents/recap.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time

import psutil
import pytest
from agent_settings import settings_from
from helpers import eventually
from hypothesis import given, settings
from hypothesis import strategies as st

from goaltender.agents.bootstrap import Misconfigured
from goaltender.agents.openai_agent import AgentConfig
from goaltender.agents.policy import CommandPolicy, classify_command
from goaltender.agents.recap import compact, estimate_tokens, recap_text, turn_groups
from goaltender.agents.tool_output import redact, secret_values, truncate_file, truncate_middle
from goaltender.agents.tool_schemas import ListFiles, Shell
from goaltender.agents.workspace_tools import WorkspaceTools
from goaltender.protocol import messages as p
from goaltender.runner.supervisor import group_members
from goaltender.storage.records import utcnow

# ---- the shell tool ----


async def no_person(question, detail, kind):
    raise AssertionError(f"nobody should be asked here: {question}")


async def test_shell_tool_times_out_and_never_hangs(tmp_path):
    # The shell tool needs no runner for allowed commands: drive it directly.
    tools = WorkspaceTools(tmp_path, CommandPolicy(), ask=no_person, shell_timeout_s=1, output_limit=16_000)
    started = time.monotonic()
    out = await tools.shell(Shell(command="echo begun; sleep 30 & sleep 30; echo never"))
    assert out.startswith("timed out after 1s: killed (exit code -15)")
    assert "begun" in out and "never" not in out
    [timed_out] = tools.shell_groups
    assert group_members(timed_out) == []  # the background sleep went with its shell
    # A background child holding the output file open does not hold the tool up.
    out = await tools.shell(Shell(command="(sleep 30; echo late) & echo quick"))
    assert out.startswith("exit code 0 (background process ") and "quick" in out
    log = out.split("further output goes to ")[1].split(")")[0]
    assert log == ".agent/shell/0002.log" and (tmp_path / log).exists()
    # A command that leaves nothing behind leaves no log either.
    assert (await tools.shell(Shell(command="echo tidy"))) == "exit code 0\ntidy\n"
    assert not (tmp_path / ".agent/shell/0003.log").exists()
    assert time.monotonic() - started < 10
    # The background sleep outlived its shell, in that shell's process group: killing it needs no
    # approval, killing anything else does.
    left = [pid for pgid in tools.shell_groups for pid in group_members(pgid)]
    assert left and all("sleep" in " ".join(psutil.Process(pid).cmdline()) for pid in left)
    assert classify_command(f"kill {left[0]}", tmp_path, is_own_pid=tools.is_own_pid).action == "allow"
    assert classify_command(f"kill {os.getpid()}", tmp_path, is_own_pid=tools.is_own_pid).action == "ask"
    assert classify_command("kill 1", tmp_path, is_own_pid=tools.is_own_pid).action == "ask"
    # The agent's last act: no background job outlives it.
    await tools.close()
    assert all(group_members(pgid) == [] for pgid in tools.shell_groups)


async def test_a_stopped_shell_command_takes_its_children_along(tmp_path):
    tools = WorkspaceTools(tmp_path, CommandPolicy(), ask=no_person, shell_timeout_s=60, output_limit=16_000)
    running = asyncio.ensure_future(tools.shell(Shell(command="sleep 50 & sleep 51 & touch started; wait")))
    await eventually((tmp_path / "started").exists)
    [group] = tools.shell_groups
    await eventually(lambda: len(group_members(group)) == 3)  # bash and both sleeps
    running.cancel()  # how a stop reaches a running tool
    with pytest.raises(asyncio.CancelledError):
        await running
    await tools.close()  # what the agent does last
    assert group_members(group) == []


async def test_list_files_does_not_list_through_a_symlink_out_of_the_workspace(tmp_path):
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    (workspace / "data").mkdir(parents=True)
    outside.mkdir()
    (outside / "someone_elses_key").write_text("x")
    (workspace / "data" / "train.txt").write_text("ok")
    (workspace / "link").symlink_to(outside)
    (workspace / "inner").symlink_to(workspace / "data")  # inside: listed as usual
    asked = []

    async def reject(question, detail, kind):
        asked.append(question)
        return p.Approval(
            id=1,
            goal_id=1,
            kind=kind,
            question=question,
            state="rejected",
            decided_by="ana",
            expires_at=utcnow(),
        )

    tools = WorkspaceTools(workspace, CommandPolicy(), ask=reject, shell_timeout_s=5, output_limit=16_000)
    listing = await tools.list_files(ListFiles(path=".", depth=3))
    assert "someone_elses_key" not in listing and asked == []
    assert f"link -> {outside} (outside the workspace: listing or reading it asks first)" in listing
    assert "inner/\n  train.txt  (2 bytes)" in listing
    refused = await tools.list_files(ListFiles(path="link"))
    assert refused.startswith("Refused:") and "someone_elses_key" not in refused
    assert asked == [f"Allow the agent to read a file outside its workspace: {outside}?"]


# ---- truncation, redaction, config ----


def test_truncate_middle_keeps_head_and_tail():
    assert truncate_middle("short", 100) == "short"
    text = "HEAD" + "x" * 10_000 + "TAIL"
    out = truncate_middle(text, 1000)
    assert out.startswith("HEAD") and out.endswith("TAIL")
    assert "[... 9,008 bytes cut from the middle of 10,008 bytes of output ...]" in out
    assert len(out) < 1100


def test_truncate_file_reads_only_head_and_tail(tmp_path):
    path = tmp_path / "out.log"
    path.write_bytes(b"start-" + b"y" * 100_000 + b"-end")
    out = truncate_file(path, 50)
    assert out.startswith("start-") and out.endswith("-end")
    assert "[... 99,960 bytes cut from the middle of 100,010 bytes of output ...]" in out
    path.write_bytes(b"hello")
    assert truncate_file(path, 50) == "hello"


def test_secrets_are_redacted():
    secrets = secret_values(
        {"OPENAI_API_KEY": "sk-abcdefgh123", "HF_TOKEN": "hf_xyz12345", "PATH": "/usr/bin:/bin"}
    )
    assert redact("key sk-abcdefgh123 and hf_xyz12345 on /usr/bin", secrets) == (
        "key [redacted] and [redacted] on /usr/bin"
    )


# Upper-case letters only: the filler, the cut marker and "[redacted]" hold none of them, so any
# upper-case letter in the output is a piece of the secret.
SECRET = "QWERTYUIOPASDFGHJKL"
FILLER = st.text(alphabet="abc xyz\n", max_size=300)


@given(
    parts=st.lists(FILLER, min_size=1, max_size=12),
    limit=st.integers(min_value=20, max_value=900),
)
@settings(max_examples=300, deadline=None)
def test_no_piece_of_a_secret_survives_the_cut(tmp_path_factory, parts, limit):
    text = SECRET.join(parts)  # the secret wherever the parts end, the cut anywhere
    path = tmp_path_factory.mktemp("out") / "out.log"
    path.write_text(text)
    for out in (truncate_middle(text, limit, [SECRET]), truncate_file(path, limit, [SECRET])):
        assert not any(c.isupper() for c in out), out
        assert out.count("[redacted]") <= text.count(SECRET)


ESCAPED = "".join(
    f"\\u{ord(c):04x}" if i % 3 == 1 else c for i, c in enumerate(SECRET)
)  # as JSON may write it
PASSWORD = "LKJHGFDSAPOIU"  # of a URL: no secret of the agent's, a URL's credentials all the same


def _decoded(text: str) -> str:
    return re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)


@given(
    parts=st.lists(st.text(alphabet="abc xyz\n", max_size=900), min_size=1, max_size=14),
    joints=st.lists(
        st.sampled_from([SECRET, ESCAPED, f"http://u:{PASSWORD}@host/"]), min_size=13, max_size=13
    ),
    limit=st.integers(min_value=20, max_value=900),
)
@settings(max_examples=200, deadline=None)
def test_no_piece_of_an_escaped_secret_or_a_password_survives_the_cut(tmp_path_factory, parts, joints, limit):
    r"""The model reads \u-escapes as the letters they are: a secret JSON-escaped, or a URL's
    password, is redacted too, and a cut (also one that reads only a long file's ends) never goes
    through one."""
    text = "".join(part + joint for part, joint in zip(parts, joints, strict=False)) + parts[-1]
    path = tmp_path_factory.mktemp("out") / "out.log"
    path.write_text(text)
    for out in (truncate_middle(text, limit, [SECRET]), truncate_file(path, limit, [SECRET])):
        assert not any(c.isupper() for c in _decoded(out)), out


def test_the_cut_keeps_what_is_not_secret():
    text = "HEAD " + "sk-secret-value-1 " * 500 + "TAIL"
    out = truncate_middle(text, 300, ["sk-secret-value-1"])
    assert out.startswith("HEAD [redacted]") and out.endswith("[redacted] TAIL")
    assert "bytes cut from the middle" in out and "sk-" not in out and "value" not in out


def test_config_from_env(monkeypatch):
    with pytest.raises(Misconfigured, match="GOALTENDER_MODEL is not set: name the model"):
        settings_from(monkeypatch, AgentConfig)
    cfg = settings_from(monkeypatch, AgentConfig, GOALTENDER_MODEL="m", OPENAI_BASE_URL="http://h:8000/v1")
    assert (cfg.base_url, cfg.api_key, cfg.context_tokens, cfg.max_turns) == (
        "http://h:8000/v1",
        "EMPTY",
        None,  # the server's word, else 128,000
        200,
    )
    assert (cfg.max_output_tokens, cfg.temperature, cfg.top_p, cfg.seed) == (None, None, None, None)
    assert (cfg.reply_tokens(128_000), cfg.reply_tokens(8192)) == (4096, 1024)
    assert (cfg.max_retries, cfg.timeout_s, cfg.shell_timeout_s, cfg.compact_at) == (3, 300, 600, 0.75)
    behind_auth = settings_from(
        monkeypatch, AgentConfig, GOALTENDER_MODEL="m", OPENAI_BASE_URL="http://ana:pw-12345678@h:8000/v1"
    )  # the client gets the URL as it is; logs, milestones and reports name it without credentials
    assert (behind_auth.base_url, behind_auth.endpoint) == (
        "http://ana:pw-12345678@h:8000/v1",
        "http://h:8000/v1",
    )
    cfg = settings_from(
        monkeypatch,
        AgentConfig,
        GOALTENDER_MODEL="m",
        GOALTENDER_OPENAI_BASE_URL="http://a/v1",
        OPENAI_BASE_URL="http://b/v1",
        OPENAI_API_KEY="sk-x",
        GOALTENDER_OPENAI_MAX_RETRIES="0",
        GOALTENDER_TOOL_OUTPUT_CHARS="5000",
    )
    assert (cfg.base_url, cfg.api_key, cfg.max_retries, cfg.output_limit(128_000)) == (
        "http://a/v1",
        "sk-x",
        0,
        5000,
    )
    assert cfg.output_limit(4000) == 1600  # never more than ~10% of the window
    sampled = settings_from(
        monkeypatch,
        AgentConfig,
        GOALTENDER_MODEL="m",
        GOALTENDER_MAX_OUTPUT_TOKENS="512",
        GOALTENDER_TEMPERATURE="0",
        GOALTENDER_TOP_P="0.9",
        GOALTENDER_SEED="7",
    )
    assert (sampled.reply_tokens(128_000), sampled.temperature, sampled.top_p, sampled.seed) == (
        512,
        0,
        0.9,
        7,
    )
    with pytest.raises(Misconfigured, match="GOALTENDER_MAX_OUTPUT_TOKENS='0' must be at least 16"):
        settings_from(monkeypatch, AgentConfig, GOALTENDER_MODEL="m", GOALTENDER_MAX_OUTPUT_TOKENS="0")
    with pytest.raises(Misconfigured, match="GOALTENDER_MAX_TURNS='many' is not a int"):
        settings_from(monkeypatch, AgentConfig, GOALTENDER_MODEL="m", GOALTENDER_MAX_TURNS="many")
    with pytest.raises(Misconfigured, match="GOALTENDER_CONTEXT_TOKENS='100' must be at least 256"):
        settings_from(monkeypatch, AgentConfig, GOALTENDER_MODEL="m", GOALTENDER_CONTEXT_TOKENS="100")
    with pytest.raises(Misconfigured, match="GOALTENDER_OPENAI_TIMEOUT_S='soon' is not a float"):
        settings_from(monkeypatch, AgentConfig, GOALTENDER_MODEL="m", GOALTENDER_OPENAI_TIMEOUT_S="soon")


def test_groups_keep_tool_results_with_their_call():
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}, {"id": "b"}]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "user", "content": "Message from ana: hi"},
        {"role": "assistant", "content": "done"},
    ]
    assert [len(g) for g in turn_groups(history)] == [1, 3, 1, 1]


def test_compaction_recaps_older_turns_and_keeps_the_latest():
    def turn(i):
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "shell", "arguments": f'{{"n": {i}}}'},
        }
        return [
            {"role": "assistant", "content": f"step {i}", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 400},
        ]

    history = [{"role": "user", "content": "Message from ana: lr only"}] + [
        m for i in range(8) for m in turn(i)
    ]
    lines, kept, recapped = compact(history, 500)
    assert recapped + len(turn_groups(kept)) == 9 and kept[-1] == history[-1]
    assert lines[0] == "- Message from ana: lr only"
    assert lines[1] == "- you said: step 0" and lines[2].startswith('- shell({"n": 0}) → xxx')
    smaller_lines, smaller_kept, _ = compact(history, 250)
    assert len(smaller_kept) < len(kept) and len(smaller_lines) > len(lines)
    # Only the latest turn fits, cut in the middle.
    _, [call, result], _ = compact(history, 150)
    assert call == history[-2] and "bytes cut from the middle" in result["content"]
    # No room at all: every turn is recapped.
    assert compact(history, 0)[1:] == ([], 9)
    text = recap_text(lines, None, turn=9, compactions=1, budget_chars=16_000)
    assert text.startswith("[Context compacted at turn 9 (#1)") and "replaced by the recap below" in text
    assert "(no experiments yet)" in text and "- Message from ana: lr only" in text


def tool_turn(calls: list[tuple[str, str]], result: str) -> list[dict]:
    """An assistant turn calling `calls` ((name, arguments JSON)), each answered with `result`."""
    specs = [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for i, (name, arguments) in enumerate(calls)
    ]
    return [
        {"role": "assistant", "content": None, "tool_calls": specs},
        *({"role": "tool", "tool_call_id": f"c{i}", "content": result} for i in range(len(calls))),
    ]


@pytest.mark.parametrize("budget", [2000, 1000])
def test_compaction_cuts_huge_tool_arguments(budget):
    big = json.dumps({"path": "big.txt", "content": "x" * 200_000})
    history = [{"role": "user", "content": "go"}, *tool_turn([("write_file", big)], "wrote 200,000 bytes")]
    _, kept, _ = compact(history, budget)
    assert estimate_tokens(kept) <= budget
    [call] = kept[0]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])  # still JSON the endpoint accepts
    assert "bytes cut from the middle" in arguments["arguments_cut_to_fit_the_context"]
    assert kept[1] == history[2] and call["id"] == "c0" and call["function"]["name"] == "write_file"


def test_compaction_of_hundreds_of_tool_calls_stays_bounded():
    window = 8000
    calls = [("shell", json.dumps({"command": f"echo call{i}"})) for i in range(300)]
    history = [{"role": "user", "content": "go"}, *tool_turn(calls, "y" * 3000)]
    lines, kept, recapped = compact(history, window // 4)
    # Even cut, 300 calls and results cannot fit: the turn is recapped with the rest.
    assert kept == [] and recapped == 2
    assert lines[1].startswith('- shell({"command": "echo call0"}) → yyy')
    text = recap_text(lines, None, turn=1, compactions=1, budget_chars=window)
    assert estimate_tokens(text) < window // 4 and "earlier steps omitted" in text
