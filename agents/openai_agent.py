"""The built-in agent: a tool-calling loop on any OpenAI-compatible Chat Completions endpoint.

The runner starts it for a goal (GOALTENDER_GOAL_ID, GOALTENDER_SOCKET, GOALTENDER_WORKSPACE,
GOALTENDER_RESUMED after a restart; cwd = the workspace). The model gets the goal's brief as its
system message and works through function tools: a shell and file tools in the workspace (risky
commands wait for a person's approval, see tools.py), the skills, and every runner verb (run an
experiment, milestone, metrics, ask, inbox, diary, report) plus `finish`.

Each turn boundary: steering from the inbox becomes user messages; when the conversation passes
~75% of the context window, older turns are replaced by a digest and the brief (goal, stop rule,
budgets, skills, the diary's latest handoff) is rebuilt from a fresh runner summary. Token usage is
logged as metrics. A dead endpoint fails the goal with a clear message; SIGTERM hands in a short
report and exits 0; no tool calls (or `finish`) ends the campaign with the model's summary.

    python -m goaltender.agents.openai_agent

Environment: GOALTENDER_MODEL (required), OPENAI_BASE_URL or GOALTENDER_OPENAI_BASE_URL,
OPENAI_API_KEY or GOALTENDER_OPENAI_API_KEY (default "EMPTY"), GOALTENDER_CONTEXT_TOKENS (128000),
GOALTENDER_MAX_TURNS (200), GOALTENDER_OPENAI_MAX_RETRIES (3), GOALTENDER_OPENAI_TIMEOUT_S (300),
GOALTENDER_SHELL_TIMEOUT_S (600), GOALTENDER_TOOL_OUTPUT_CHARS (16000), GOALTENDER_COMPACT_AT
(0.75), GOALTENDER_COMMAND_POLICY (inline JSON or a .json/.toml file; see tools.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from goaltender.agents import briefing
from goaltender.agents.tools import (
    CommandPolicy,
    classify_command,
    inside,
    redact,
    resolve_path,
    secret_values,
    tool_specs,
    truncate_file,
    truncate_middle,
)
from goaltender.runner import protocol as p
from goaltender.runner.client import RunnerClient, RunnerUnavailable, socket_from_env
from goaltender.storage.records import MetricPoint

PREAMBLE = """\
You are goaltender's built-in research agent. You pursue the goal below as a budgeted campaign on \
this machine: baseline first, then one hypothesis per experiment, each measured and recorded, \
until the stop rule or a budget ends it. You work through function tools; the brief's \
`goaltender <verb>` commands are these tools: `goaltender experiment` = run_experiment, \
`milestone` = milestone, `metrics` = log_metrics, `ask` = ask_approval, `inbox` = read_inbox, \
`diary` = write_diary / read_diary, `report` = submit_report. Also: shell, read_file, write_file, \
edit_file, list_files, load_skill, and finish.

Rules:
- Run every experiment through run_experiment (never as a bare shell command): that is what puts \
it in the ledger and keeps it within budget. Print the headline metric as a final `name: value` line.
- Post a milestone with your plan at the start, on each new best, and when you change direction.
- After each experiment write a diary handoff (write_diary with handoff=true): best so far, what \
was tried, what is next, constraints people gave. A restarted or compacted session starts from it.
- Risky shell commands (sudo, installs, network, deleting or writing outside the workspace, \
killing processes you did not start) wait for a person's approval; if rejected, adapt the plan.
- Messages from people arrive as "Message from <name>: ..." between turns. Follow them; they \
steer the campaign, they do not end it.
- When the stop rule is met, the budget is used up, or nothing is left worth trying, call finish \
with a summary: what was learnt, the best config and result, what to try next.
"""

COMPACT_NOTE = "[Context compacted"
START = (
    "Begin goal #{goal_id}. State your plan in a milestone, run the baseline first through "
    "run_experiment, then one hypothesis per experiment. Write a diary handoff after each "
    "experiment. Call finish with your summary when you are done."
)
RESUME = (
    "You were restarted and are resuming goal #{goal_id}: the conversation before the restart is "
    "gone. The brief above has the ledger so far and your latest diary handoff; check the "
    "workspace, then go on from where the handoff says you were."
)
SKIP_DIRS = {
    ".git",
    "__pycache__",
    ".venv",
    "venv",
    "node_modules",
    ".agents",
    ".agent",
    ".mypy_cache",
    ".ruff_cache",
}


def say(message: str) -> None:
    """A line in agent.log (the runner keeps the agent's stderr there)."""
    print(f"{time.strftime('%H:%M:%S')} openai-agent: {message}", file=sys.stderr, flush=True)


def estimate_tokens(obj: Any) -> int:
    return len(json.dumps(obj, ensure_ascii=False)) // 4 + 1


class ConfigError(ValueError):
    pass


class EndpointFailure(Exception):
    """The model endpoint cannot serve us: the goal fails with this message."""

    def __init__(self, title: str, detail: str = ""):
        super().__init__(title)
        self.title = title
        self.detail = detail


@dataclass
class AgentConfig:
    model: str
    base_url: str | None
    api_key: str
    context_tokens: int = 128_000
    max_turns: int = 200
    max_retries: int = 3
    timeout_s: float = 300.0
    shell_timeout_s: float = 600.0
    output_chars: int = 16_000
    compact_at: float = 0.75

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AgentConfig:
        model = env.get("GOALTENDER_MODEL", "").strip()
        if not model:
            raise ConfigError(
                "GOALTENDER_MODEL is not set: name the model the endpoint serves (and set "
                "OPENAI_BASE_URL / OPENAI_API_KEY for the endpoint: vLLM, NIM, OpenAI, ...)"
            )

        def number(name: str, default: float, kind: type = int, low: float = 1) -> Any:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a {kind.__name__}") from None
            if value < low:
                raise ConfigError(f"{name}={raw!r} must be at least {low}")
            return value

        return cls(
            model=model,
            base_url=(env.get("GOALTENDER_OPENAI_BASE_URL") or env.get("OPENAI_BASE_URL") or None),
            api_key=env.get("GOALTENDER_OPENAI_API_KEY") or env.get("OPENAI_API_KEY") or "EMPTY",
            context_tokens=number("GOALTENDER_CONTEXT_TOKENS", 128_000, int, 256),
            max_turns=number("GOALTENDER_MAX_TURNS", 200),
            max_retries=number("GOALTENDER_OPENAI_MAX_RETRIES", 3, int, 0),
            timeout_s=number("GOALTENDER_OPENAI_TIMEOUT_S", 300.0, float, 0.1),
            shell_timeout_s=number("GOALTENDER_SHELL_TIMEOUT_S", 600.0, float, 0.1),
            output_chars=number("GOALTENDER_TOOL_OUTPUT_CHARS", 16_000, int, 200),
            compact_at=number("GOALTENDER_COMPACT_AT", 0.75, float, 0.1),
        )

    @property
    def endpoint(self) -> str:
        return self.base_url or "https://api.openai.com/v1"

    @property
    def output_limit(self) -> int:
        """Bytes of one tool result: the configured cap, and never more than ~10% of the window."""
        return max(200, min(self.output_chars, self.context_tokens * 4 // 10))


def _groups(history: list[dict]) -> list[list[dict]]:
    """Messages grouped so that a tool result never leaves its assistant call: each group starts
    at a user or assistant message."""
    groups: list[list[dict]] = []
    for message in history:
        if message["role"] == "tool" and groups:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


def _one_line(text: Any, limit: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class OpenAIAgent:
    def __init__(
        self,
        runner: RunnerClient,
        goal_id: int,
        config: AgentConfig,
        workspace: Path,
        policy: CommandPolicy,
        resumed: bool = False,
    ):
        import openai  # slow to import: after the signal handler and the runner connection

        self.runner = runner
        self.goal_id = goal_id
        self.cfg = config
        self.workspace = workspace.resolve()
        self.policy = policy
        self.resumed = resumed
        self.client = openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key,
            max_retries=config.max_retries,
            timeout=openai.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
        )
        self.tools = tool_specs(with_eval_command="eval_command" in p.RunExperiment.model_fields)
        self.handlers = {
            "shell": self.t_shell,
            "read_file": self.t_read_file,
            "write_file": self.t_write_file,
            "edit_file": self.t_edit_file,
            "list_files": self.t_list_files,
            "load_skill": self.t_load_skill,
            "run_experiment": self.t_run_experiment,
            "milestone": self.t_milestone,
            "log_metrics": self.t_log_metrics,
            "ask_approval": self.t_ask_approval,
            "read_inbox": self.t_read_inbox,
            "write_diary": self.t_write_diary,
            "read_diary": self.t_read_diary,
            "submit_report": self.t_submit_report,
            "finish": self.t_finish,
        }
        self.messages: list[dict] = []
        self.turn = 0
        self.input_total = 0
        self.output_total = 0
        self.measured: tuple[int, int] | None = None  # (messages counted, tokens) from the last usage
        # What a request costs beyond its messages (the tool schemas, the chat template), measured
        # as the last usage minus our estimate of the messages sent; the schemas' estimate at first.
        self.overhead = estimate_tokens(self.tools)
        self.compactions = 0
        self.loaded_skills: list[str] = []
        self.steers: list[str] = []
        self.pending_steers: list[p.InboxMessage] = []
        self.digest_lines: list[str] = []
        self.digest_message: dict | None = None
        self.report_text = ""
        self.final_text = ""
        self.finished = False
        self.last_step = ""
        self.shell_count = 0
        self.approved_commands: set[str] = set()
        self.approved_paths: set[tuple[str, Path]] = set()
        self.secrets = secret_values(dict(os.environ))
        self.writable = [self.workspace, *(Path(w).expanduser().resolve() for w in policy.writable_paths)]
        self.readable = [*self.writable, *(Path(r).expanduser().resolve() for r in policy.readable_paths)]

    # ---- the loop ----

    async def run(self) -> None:
        summary = await self._summary()
        handoff = await self._handoff()
        briefing.prepare_workspace(self.workspace, briefing.goal_brief(summary, handoff))
        if self.resumed:
            inbox = await self.runner.call(p.ReadInbox, p.InboxReply, goal_id=self.goal_id, all=True)
            for message in inbox.messages:
                if message.read_at is None:
                    self.pending_steers.append(message)
                else:
                    self.steers.append(self._steer_text(message))
        self.messages = [
            {"role": "system", "content": self._system_text(summary, handoff)},
            {"role": "user", "content": (RESUME if self.resumed else START).format(goal_id=self.goal_id)},
        ]
        if self.resumed:
            await self._milestone(
                "Resumed after a restart",
                "The brief was rebuilt from the runner's ledger"
                + (" and the diary's latest handoff" if handoff else " (no diary handoff found)")
                + f"; {len(summary.ledger)} experiments so far.",
            )
        say(
            f"goal #{self.goal_id}: model {self.cfg.model} at {self.cfg.endpoint}, window {self.cfg.context_tokens}"
        )
        nudged = False
        while True:
            if self.turn >= self.cfg.max_turns:
                cap = f"**Stopped after {self.turn} model turns** (the GOALTENDER_MAX_TURNS cap)."
                self.final_text = f"{cap}\n\n{self.final_text}" if self.final_text else cap
                ending = f"the turn cap ({self.cfg.max_turns}) was reached"
                break
            await self._inject_inbox()
            if self.context_tokens() > self.cfg.compact_at * self.cfg.context_tokens:
                await self.compact()
            response = await self._complete()
            if not getattr(response, "choices", None):
                raise EndpointFailure(
                    f"Model endpoint returned no answer: {self.cfg.endpoint}: a reply without choices",
                    f"model {self.cfg.model}: {_one_line(response, 300)}",
                )
            self.turn += 1
            choice = response.choices[0]
            message = choice.message
            calls = list(message.tool_calls or [])
            ids = [c.id or f"call_{self.turn}_{i}" for i, c in enumerate(calls)]  # some servers omit ids
            assistant: dict[str, Any] = {
                "role": "assistant",
                "content": message.content or ("" if not calls else None),
            }
            if calls:
                assistant["tool_calls"] = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments or "{}"},
                    }
                    for c, call_id in zip(calls, ids, strict=True)
                ]
            self.messages.append(assistant)
            await self._account(response.usage)
            if message.content:
                self.final_text = message.content
            if not calls:
                if choice.finish_reason == "length":
                    self.messages.append(
                        {"role": "user", "content": "Your reply hit the output limit; go on, more briefly."}
                    )
                    continue
                if not (message.content or "").strip() and not nudged:
                    nudged = True
                    self.messages.append(
                        {
                            "role": "user",
                            "content": "You replied with nothing. Go on with the next step, or call finish.",
                        }
                    )
                    continue
                ending = "the model gave its final answer"
                break
            for call, call_id in zip(calls, ids, strict=True):
                result = await self._execute(call.function.name, call.function.arguments)
                self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            if self.finished:
                ending = "the model called finish"
                break
        say(f"done after {self.turn} turns: {ending}")
        await self.runner.call(
            p.SubmitReport, p.Done, goal_id=self.goal_id, text=self._report(ending)[:50_000]
        )

    def _report(self, ending: str) -> str:
        parts = [t.strip() for t in (self.report_text, self.final_text) if t and t.strip()]
        if len(parts) == 2 and parts[1] in parts[0]:
            parts = parts[:1]
        return "\n\n".join(parts) or f"The agent ended without a summary ({ending})."

    async def stop_report(self) -> None:
        """SIGTERM: the short report, fast."""
        lines = [f"**Stopped** by the runner after {self.turn} model turns."]
        if self.last_step:
            lines.append(f"**Last step:** {self.last_step}")
        if self.report_text:
            lines.append(self.report_text.strip())
        elif self.final_text:
            lines.append(f"**Last note from the model:** {_one_line(self.final_text, 1500)}")
        await self.runner.call(p.SubmitReport, p.Done, goal_id=self.goal_id, text="\n\n".join(lines)[:50_000])

    async def _complete(self) -> Any:
        import openai

        retried_context = False
        while True:
            try:
                return await self.client.chat.completions.create(
                    model=self.cfg.model, messages=self.messages, tools=self.tools, tool_choice="auto"
                )
            except openai.BadRequestError as exc:
                text = str(exc).lower()
                if not retried_context and any(
                    w in text for w in ("context", "too long", "maximum", "token")
                ):
                    say(f"the endpoint refused the request as too long; compacting ({exc})")
                    retried_context = True
                    await self.compact(force=True)
                    continue
                raise EndpointFailure(
                    f"Model endpoint refused the request: {self.cfg.endpoint}: {exc}"
                ) from exc
            except openai.APIConnectionError as exc:  # also APITimeoutError
                raise EndpointFailure(
                    f"Model endpoint unreachable: {self.cfg.endpoint}: {_error_text(exc)}",
                    f"after {self.cfg.max_retries} retries; the model was {self.cfg.model}",
                ) from exc
            except openai.APIStatusError as exc:
                if exc.status_code == 429 or exc.status_code >= 500:
                    title = f"Model endpoint unreachable: {self.cfg.endpoint}: {_error_text(exc)}"
                else:
                    title = f"Model endpoint refused the request: {self.cfg.endpoint}: {_error_text(exc)}"
                raise EndpointFailure(
                    title,
                    f"HTTP {exc.status_code} after {self.cfg.max_retries} retries; model {self.cfg.model}",
                ) from exc

    async def _account(self, usage: Any) -> None:
        if usage is not None and getattr(usage, "prompt_tokens", None) is not None:
            prompt, completion = usage.prompt_tokens, usage.completion_tokens or 0
            self.overhead = prompt - estimate_tokens(self.messages[:-1])
        else:
            prompt, completion = estimate_tokens(self.messages[:-1]), estimate_tokens(self.messages[-1])
        self.measured = (len(self.messages), prompt + completion)
        self.input_total += prompt
        self.output_total += completion
        points = [
            MetricPoint(name="agent/input_tokens", value=self.input_total, step=self.turn),
            MetricPoint(name="agent/output_tokens", value=self.output_total, step=self.turn),
            MetricPoint(name="agent/context_tokens", value=prompt + completion, step=self.turn),
        ]
        try:
            await self.runner.call(p.LogMetrics, p.Done, goal_id=self.goal_id, points=points)
        except p.ProtocolError as exc:
            say(f"could not log token metrics: {exc}")

    def context_tokens(self) -> int:
        """Tokens the next request will carry: the last measured usage plus estimates of what came
        after it; before any reply (or after a compaction), an estimate of everything."""
        if self.measured is not None and self.measured[0] <= len(self.messages):
            count, tokens = self.measured
            return tokens + (estimate_tokens(self.messages[count:]) if count < len(self.messages) else 0)
        return estimate_tokens(self.messages) + self.overhead

    # ---- steering ----

    @staticmethod
    def _steer_text(message: p.InboxMessage) -> str:
        return f"Message from {message.author}: {message.text}"

    async def _inject_inbox(self) -> None:
        messages, self.pending_steers = self.pending_steers, []
        try:
            messages += (await self.runner.call(p.ReadInbox, p.InboxReply, goal_id=self.goal_id)).messages
        except p.ProtocolError as exc:
            say(f"could not read the inbox: {exc}")
        for message in messages:
            text = self._steer_text(message)
            self.steers.append(text)
            self.messages.append({"role": "user", "content": text})
            say(f"steer: {_one_line(text, 200)}")

    # ---- context management ----

    def _system_text(self, summary: p.SummaryReply, handoff: str | None) -> str:
        parts = [PREAMBLE, briefing.goal_brief(summary, handoff)]
        if self.loaded_skills:
            parts.append(
                "## Skills you loaded\n\n"
                + "\n".join(f"- `{name}`" for name in dict.fromkeys(self.loaded_skills))
                + "\n\n(load_skill again for their full text.)"
            )
        if self.steers:
            parts.append(
                "## Steering from people so far (oldest first; it still applies)\n\n"
                + "\n".join(f"- {_one_line(s, 600)}" for s in self.steers[-20:])
            )
        return "\n\n".join(part.strip() for part in parts) + "\n"

    async def _summary(self) -> p.SummaryReply:
        return await self.runner.call(p.Summary, p.SummaryReply, goal_id=self.goal_id)

    async def _handoff(self) -> str | None:
        diary = await self.runner.call(
            p.ReadDiary, p.DiaryReply, goal_id=self.goal_id, last=1, kind="handoff"
        )
        return diary.entries[-1].text if diary.entries else None

    async def compact(self, force: bool = False) -> None:
        """Replace older turns by a digest; rebuild the brief from a fresh runner summary and the
        diary's latest handoff. The latest turns stay verbatim (up to ~25% of the window)."""
        before = self.context_tokens()
        summary = await self._summary()
        handoff = await self._handoff()
        window = self.cfg.context_tokens
        groups = _groups([m for m in self.messages[1:] if m is not self.digest_message])
        tail_budget = window // (8 if force else 4)
        keep: list[list[dict]] = []
        used = 0
        for group in reversed(groups):
            cost = estimate_tokens(group)
            if used + cost > tail_budget:
                break
            keep.insert(0, group)
            used += cost
        if not keep and groups:
            keep = [self._shrink(groups[-1], tail_budget * 4)]
        old = groups[: len(groups) - len(keep)]
        self.digest_lines += [line for group in old for line in self._digest(group)]
        self.compactions += 1
        self.messages = [{"role": "system", "content": self._system_text(summary, handoff)}]
        self.digest_message = {"role": "user", "content": self._digest_text(summary, window)}
        self.messages.append(self.digest_message)
        self.messages += [m for group in keep for m in group]
        self.measured = None
        after = self.context_tokens()
        say(
            f"compacted the context: ~{before} -> ~{after} tokens (window {window}), {len(old)} turns digested"
        )
        with contextlib.suppress(p.ProtocolError):
            await self.runner.call(
                p.LogMetrics,
                p.Done,
                goal_id=self.goal_id,
                points=[MetricPoint(name="agent/compactions", value=self.compactions, step=self.turn)],
            )

    def _shrink(self, group: list[dict], budget_chars: int) -> list[dict]:
        share = max(200, budget_chars // max(1, len(group)))
        shrunk = []
        for message in group:
            if isinstance(message.get("content"), str) and len(message["content"]) > share:
                message = {**message, "content": truncate_middle(message["content"], share)}
            shrunk.append(message)
        return shrunk

    def _digest(self, group: list[dict]) -> list[str]:
        first = group[0]
        if first["role"] == "user":
            content = first.get("content") or ""
            if content.startswith("Message from "):
                return [f"- {_one_line(content, 600)}"]
            return [f"- (instruction) {_one_line(content, 200)}"]
        lines = []
        if first.get("content"):
            lines.append(f"- you said: {_one_line(first['content'], 400)}")
        results = {m.get("tool_call_id"): m.get("content", "") for m in group[1:]}
        for call in first.get("tool_calls") or []:
            fn = call["function"]
            lines.append(
                f"- {fn['name']}({_one_line(fn['arguments'], 240)}) → {_one_line(results.get(call['id'], '(no result)'), 360)}"
            )
        return lines

    def _digest_text(self, summary: p.SummaryReply, window: int) -> str:
        budget = window * 4 // 5  # ~20% of the window, in characters
        lines = list(self.digest_lines)
        omitted = 0
        while lines and sum(len(line) + 1 for line in lines) > budget:
            lines.pop(0)
            omitted += 1
        head = (
            f"{COMPACT_NOTE} at turn {self.turn} (#{self.compactions}): the older part of this "
            "conversation was replaced by the digest below. The system message holds the current "
            "brief: goal, stop rule, budgets, skills, steering and your latest diary handoff.]"
        )
        ledger = truncate_middle(summary.text, window * 4 // 7) if summary.ledger else "(no experiments yet)"
        body = [
            head,
            "",
            "## Ledger (from the runner)",
            "",
            ledger,
            "",
            "## Earlier steps (oldest first)",
            "",
        ]
        if omitted:
            body.append(f"({omitted} earlier steps omitted)")
        body += lines or ["(none)"]
        body += ["", "Go on from the latest step; write a diary handoff if yours is out of date."]
        return "\n".join(body)

    # ---- tools ----

    async def _execute(self, name: str, raw_arguments: str | None) -> str:
        handler = self.handlers.get(name)
        if handler is None:
            return f"error: there is no tool {name!r}; the tools are: {', '.join(self.handlers)}"
        try:
            arguments = json.loads(raw_arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("the arguments must be a JSON object")
        except ValueError as exc:
            return f"error: the arguments of {name} are not valid JSON ({exc}); send a JSON object"
        self.last_step = f"{name}({_one_line(raw_arguments, 200)})"
        say(f"turn {self.turn}: {self.last_step}")
        try:
            result = await handler(**arguments)
        except TypeError as exc:
            result = f"error: bad arguments for {name}: {exc}"
        except p.ProtocolError as exc:
            result = f"error: the runner refused {name}: {exc.error.code}: {exc.error.message}"
            if exc.error.code in ("budget_exhausted", "conflict"):
                result += "\nThe campaign cannot go on: submit your report and call finish."
        except RunnerUnavailable:
            raise
        except Exception as exc:  # a tool failure is the model's business, never the loop's
            result = f"error: {name} failed: {type(exc).__name__}: {exc}"
        return truncate_middle(redact(str(result), self.secrets), self.cfg.output_limit)

    # -- approvals --

    async def _ask(self, question: str, detail: str, kind: str = "command") -> p.Approval:
        reply = await self.runner.call(
            p.Ask,
            p.DecisionReply,
            goal_id=self.goal_id,
            question=question[:3000],
            detail=detail[:20_000],
            kind=kind,
        )
        return reply.approval

    @staticmethod
    def _decision(approval: p.Approval) -> str:
        who = approval.decided_by or "nobody"
        return f"{approval.state} by {who}" + (f": {approval.comment}" if approval.comment else "")

    def _is_own_pid(self, pid: int) -> bool:
        try:
            return pid != os.getpid() and os.getpgid(pid) == os.getpgrp()
        except (ProcessLookupError, PermissionError):
            return False

    async def _gate_command(self, command: str, what: str = "shell") -> tuple[bool, str]:
        """(may run, note for the tool result) after the policy and, if it says so, a person."""
        verdict = classify_command(command, self.workspace, self.policy, self._is_own_pid)
        if verdict.action == "allow" or command in self.approved_commands:
            return True, ""
        if verdict.action == "deny":
            say(f"denied: {command!r}: {verdict.reason}")
            return False, f"Denied by the command policy ({verdict.reason}); it was not run and will not be."
        say(f"asking before {what}: {command!r}: {verdict.reason}")
        approval = await self._ask(
            f"Allow the agent to run: {_one_line(command, 400)}",
            f"Command ({what}):\n{command}\n\nWhy it needs approval: {verdict.reason}\nWorkspace: {self.workspace}",
        )
        if approval.state == "approved":
            self.approved_commands.add(command)
            return True, f"(Approval asked because it {verdict.reason}: {self._decision(approval)}.)\n"
        return False, (
            f"Not run: the command was {self._decision(approval)}. It needed approval because it "
            f"{verdict.reason}. Do not retry it as is; adapt your plan."
        )

    async def _gate_path(self, raw: str, mode: str) -> tuple[Path, str | None]:
        """The resolved path, and None if the tool may go on, else the reason it may not."""
        path = resolve_path(raw, self.workspace)
        roots = self.readable if mode == "read" else self.writable
        if inside(path, roots) or (mode, path) in self.approved_paths:
            return path, None
        approval = await self._ask(
            f"Allow the agent to {mode} a file outside its workspace: {path}?",
            f"The {mode}_file tool was called with {raw!r}, which is outside {self.workspace}.",
        )
        if approval.state == "approved":
            self.approved_paths.add((mode, path))
            return path, None
        return (
            path,
            f"Refused: {path} is outside the workspace and the request to {mode} it was {self._decision(approval)}.",
        )

    # -- workspace tools --

    async def t_shell(self, command: str, timeout_s: float | None = None) -> str:
        ok, note = await self._gate_command(command)
        if not ok:
            return note
        limit = min(float(timeout_s or self.cfg.shell_timeout_s), self.cfg.shell_timeout_s)
        # Output goes to a file, not a pipe: a background job the command leaves behind can write
        # on without blocking on a full pipe (or dying of SIGPIPE), and the model can read it later.
        self.shell_count += 1
        log_path = self.workspace / ".agent" / "shell" / f"{self.shell_count:04d}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                command,
                cwd=self.workspace,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), limit)
            except TimeoutError:
                timed_out = True
                await _kill_tree(proc.pid)
                await proc.wait()
        except asyncio.CancelledError:
            await asyncio.shield(_kill_tree(proc.pid))
            raise
        lingering = await asyncio.to_thread(_holders, log_path)
        head = note + (
            f"timed out after {limit:g}s: killed (exit code {proc.returncode})"
            if timed_out
            else f"exit code {proc.returncode}"
        )
        if lingering:
            head += (
                f" (background process {', '.join(map(str, lingering))} still running; its further output "
                f"goes to {log_path.relative_to(self.workspace)})"
            )
        room = max(100, self.cfg.output_limit - len(head.encode()) - 120)  # the marker fits too
        output = truncate_file(log_path, room) or "(no output)"
        if not lingering:
            log_path.unlink(missing_ok=True)
        return f"{head}\n{output}"

    async def t_read_file(self, path: str, offset: int = 1, limit: int = 2000) -> str:
        resolved, refused = await self._gate_path(path, "read")
        if refused:
            return refused
        data = resolved.read_bytes()
        if b"\0" in data[:8192]:
            return f"{resolved} is a binary file ({len(data):,} bytes)."
        lines = data.decode(errors="replace").splitlines(keepends=True)
        start = max(1, int(offset))
        chosen = lines[start - 1 : start - 1 + max(1, int(limit))]
        text = "".join(chosen)
        if start > 1 or start - 1 + len(chosen) < len(lines):
            text = f"[lines {start}-{start + len(chosen) - 1} of {len(lines)}]\n" + text
        if len(text.encode()) > self.cfg.output_limit:
            text = (
                truncate_middle(text, self.cfg.output_limit - 100) + "\n[read fewer lines with offset/limit]"
            )
        return text or "(empty file)"

    async def t_write_file(self, path: str, content: str) -> str:
        resolved, refused = await self._gate_path(path, "write")
        if refused:
            return refused
        resolved.parent.mkdir(parents=True, exist_ok=True)
        resolved.write_text(content)
        return f"wrote {len(content.encode()):,} bytes to {resolved}"

    async def t_edit_file(self, path: str, old_string: str, new_string: str) -> str:
        resolved, refused = await self._gate_path(path, "write")
        if refused:
            return refused
        text = resolved.read_text()
        count = text.count(old_string) if old_string else 0
        if count != 1:
            return f"error: old_string occurs {count} times in {resolved}; it must occur exactly once " + (
                "(include more surrounding lines)" if count else "(check it against read_file)"
            )
        resolved.write_text(text.replace(old_string, new_string, 1))
        return f"edited {resolved}: replaced 1 occurrence"

    async def t_list_files(self, path: str = ".", depth: int = 2) -> str:
        resolved, refused = await self._gate_path(path, "read")
        if refused:
            return refused
        if not resolved.is_dir():
            return f"error: {resolved} is not a directory"
        lines: list[str] = []

        def walk(directory: Path, level: int) -> None:
            try:
                entries = sorted(directory.iterdir(), key=lambda e: (not e.is_dir(), e.name))
            except OSError as exc:
                lines.append(f"{'  ' * level}(cannot list: {exc})")
                return
            for entry in entries:
                if len(lines) >= 400:
                    return
                if entry.is_dir():
                    lines.append(f"{'  ' * level}{entry.name}/")
                    if entry.name not in SKIP_DIRS and level + 1 < max(1, int(depth)):
                        walk(entry, level + 1)
                else:
                    with contextlib.suppress(OSError):
                        lines.append(f"{'  ' * level}{entry.name}  ({entry.stat().st_size:,} bytes)")

        walk(resolved, 0)
        if len(lines) >= 400:
            lines.append("[listing capped at 400 entries]")
        return f"{resolved}:\n" + ("\n".join(lines) or "(empty)")

    async def t_load_skill(self, name: str) -> str:
        try:
            text = briefing.load_skill(name)
        except KeyError as exc:
            return f"error: {exc.args[0]}"
        self.loaded_skills.append(name)
        return text

    # -- runner verbs --

    async def t_run_experiment(
        self,
        command: str | list[str],
        description: str,
        params: dict | None = None,
        metric: str | None = None,
        direction: str | None = None,
        timeout_s: float | None = None,
        eval_command: str | list[str] | None = None,
    ) -> str:
        if isinstance(command, str):
            argv, text = ["bash", "-c", command], command
        else:
            argv, text = [str(a) for a in command], shlex.join(str(a) for a in command)
        ok, note = await self._gate_command(text, "experiment")
        if not ok:
            return note
        fields: dict[str, Any] = {
            "goal_id": self.goal_id,
            "command": argv,
            "description": description,
            "params": params or {},
            "metric": metric or None,
            "direction": direction or None,
            "timeout_s": timeout_s or None,
        }
        if eval_command:
            fields["eval_command"] = (
                ["bash", "-c", eval_command] if isinstance(eval_command, str) else eval_command
            )
        reply = await self.runner.call(p.RunExperiment, p.ExperimentReply, **fields)
        e = reply.experiment
        lines = [
            note + f"Experiment #{e.index}: {e.status}" + (" (new best)" if reply.new_best else ""),
            f"{e.metric_name}: {e.metric_value}" if e.metric_name else "no headline metric",
        ]
        if e.metrics:
            lines.append("metrics: " + ", ".join(f"{k}={v:g}" for k, v in e.metrics.items()))
        if e.wall_seconds is not None:
            lines.append(f"wall {e.wall_seconds:.1f}s, exit code {e.exit_code}")
        if e.note:
            lines.append(f"note: {e.note}")
        if reply.stop_status:
            lines.append(f"budget: {reply.stop_status}")
        if e.log_path:
            lines.append(f"log: {e.log_path}")
            if e.status == "crash":
                with contextlib.suppress(OSError):
                    log = Path(e.log_path).read_bytes()
                    lines.append("last lines of the log:\n" + log[-1500:].decode(errors="replace"))
        return "\n".join(lines)

    async def _milestone(self, title: str, text: str = "") -> None:
        title = _one_line(redact(title, self.secrets), 300)
        await self.runner.call(
            p.ReportMilestone,
            p.Done,
            goal_id=self.goal_id,
            title=title,
            text=redact(text, self.secrets)[:20_000],
        )

    async def t_milestone(self, title: str, text: str = "") -> str:
        await self._milestone(title, text)
        return "milestone posted"

    async def t_log_metrics(
        self, metrics: dict[str, float], step: float | None = None, experiment_id: int | None = None
    ) -> str:
        points = [MetricPoint(name=str(k), value=float(v), step=step) for k, v in metrics.items()]
        if not points:
            return "error: no metrics given"
        reply = await self.runner.call(
            p.LogMetrics, p.Done, goal_id=self.goal_id, points=points, experiment_id=experiment_id
        )
        return reply.message

    async def t_ask_approval(self, question: str, detail: str = "", kind: str = "generic") -> str:
        approval = await self._ask(question, detail, kind or "generic")
        return f"The request was {self._decision(approval)}."

    async def t_read_inbox(self) -> str:
        reply = await self.runner.call(p.ReadInbox, p.InboxReply, goal_id=self.goal_id)
        texts = [self._steer_text(m) for m in reply.messages]
        self.steers += texts
        return "\n".join(texts) or "(no new messages)"

    async def t_write_diary(self, text: str, handoff: bool = False) -> str:
        reply = await self.runner.call(
            p.WriteDiary,
            p.Done,
            goal_id=self.goal_id,
            text=redact(text, self.secrets),
            kind="handoff" if handoff else "note",
        )
        return reply.message

    async def t_read_diary(self, last: int = 5, handoff_only: bool = False) -> str:
        reply = await self.runner.call(
            p.ReadDiary,
            p.DiaryReply,
            goal_id=self.goal_id,
            last=max(1, min(int(last), 100)),
            kind="handoff" if handoff_only else None,
        )
        return (
            "\n\n".join(f"[{e.ts:%Y-%m-%d %H:%M} {e.kind}] {e.text}" for e in reply.entries)
            or "(empty diary)"
        )

    async def t_submit_report(self, text: str) -> str:
        self.report_text = text
        reply = await self.runner.call(p.SubmitReport, p.Done, goal_id=self.goal_id, text=text[:50_000])
        return reply.message

    async def t_finish(self, summary: str = "") -> str:
        self.finished = True
        self.final_text = summary
        return "finishing: the report is being handed in"


def _error_text(exc: BaseException) -> str:
    """The exception and its causes, e.g. 'Connection error. (ConnectError: [Errno 111] ...)'."""
    text = str(exc) or type(exc).__name__
    cause, seen = exc.__cause__ or exc.__context__, 0
    while cause is not None and seen < 4:
        if str(cause) and str(cause) not in text:
            text += f" ({type(cause).__name__}: {cause})"
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return _one_line(text, 500)


def _holders(path: Path) -> list[int]:
    """Processes of this agent's process group (other than itself) that have `path` open: the
    background jobs a shell command left running with its output."""
    target, me, group, holders = os.path.realpath(path), os.getpid(), os.getpgrp(), []
    for proc in psutil.process_iter(["pid"]):
        try:
            mine = proc.pid != me and os.getpgid(proc.pid) == group
            if mine and any(os.path.realpath(f.path) == target for f in proc.open_files()):
                holders.append(proc.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return holders


async def _kill_tree(pid: int, grace_s: float = 2.0) -> None:
    """SIGTERM a shell command and everything it started, SIGKILL what is left after grace_s."""
    try:
        root = psutil.Process(pid)
        # The shell first: signalled after its children, it would run the rest of its script.
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    # Poll rather than psutil.wait_procs: that would reap the shell under asyncio's child watcher.
    deadline = time.monotonic() + grace_s
    while (alive := [proc for proc in procs if _alive(proc)]) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def amain() -> int:
    main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main_task.cancel)
    goal_id = int(os.environ["GOALTENDER_GOAL_ID"])
    workspace = Path(os.environ.get("GOALTENDER_WORKSPACE") or os.getcwd())
    problem = None
    try:
        config = AgentConfig.from_env(os.environ)
        home = Path(os.environ["GOALTENDER_HOME"]) if os.environ.get("GOALTENDER_HOME") else None
        policy = CommandPolicy.load(os.environ.get("GOALTENDER_COMMAND_POLICY"), home)
    except (ConfigError, ValueError, OSError) as exc:
        problem = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ConfigError) else str(exc)
        say(f"misconfigured: {problem}")
    runner: RunnerClient | None = None
    agent: OpenAIAgent | None = None
    try:
        runner = await RunnerClient.connect_unix(socket_from_env(), client=f"agent:openai:{goal_id}")
        if problem is not None:
            await runner.call(
                p.ReportMilestone,
                p.Done,
                goal_id=goal_id,
                title="The built-in agent is misconfigured",
                text=problem,
            )
            return 2
        agent = OpenAIAgent(
            runner, goal_id, config, workspace, policy, resumed=bool(os.environ.get("GOALTENDER_RESUMED"))
        )
        await agent.run()
        return 0
    except asyncio.CancelledError:
        # Stopped by the runner: hand in the report within its grace period, then go.
        say("SIGTERM: handing in the report")
        if agent is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(agent.stop_report(), 2.5)
        return 0
    except EndpointFailure as exc:
        say(f"{exc.title} ({exc.detail})" if exc.detail else exc.title)
        if runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    runner.call(
                        p.ReportMilestone,
                        p.Done,
                        goal_id=goal_id,
                        title=_one_line(exc.title, 300),
                        text=f"{exc.title}\n{exc.detail}\nThe goal fails: the agent cannot work without its model.",
                    ),
                    5,
                )
                if agent is not None:
                    await asyncio.wait_for(
                        runner.call(
                            p.SubmitReport,
                            p.Done,
                            goal_id=goal_id,
                            text=f"**The agent failed:** {exc.title}.\n\n{agent._report('the endpoint failed')}",
                        ),
                        5,
                    )
        return 1
    except RunnerUnavailable as exc:
        say(f"lost the runner: {exc}")
        return 4 if problem is None else 2
    finally:
        if agent is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(agent.client.close(), 2)
        if runner is not None:
            await runner.close()


def main() -> None:
    if not os.environ.get("GOALTENDER_GOAL_ID"):
        print(
            "openai_agent: GOALTENDER_GOAL_ID is not set; the runner starts this agent for a goal",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.exit(asyncio.run(amain()))


if __name__ == "__main__":
    main()
