"""The built-in agent: a tool-calling loop on any OpenAI-compatible Chat Completions endpoint.

The runner starts it for a goal (see bootstrap.py). The model gets the goal's brief as its system
message and works through function tools (tool_schemas.py): a shell and file tools in the
workspace (workspace_tools.py; risky commands wait for a person's approval, see policy.py), the
skills, every runner verb (runner_verbs.py: run an experiment, milestone, metrics, ask, inbox,
diary, report), and `finish`.

Each turn boundary: steering from the inbox becomes user messages; when the conversation passes
~75% of the context window, older turns are replaced by a recap (recap.py) and the brief (goal,
stop rule, budgets, skills, the diary's latest handoff) is rebuilt from a fresh runner summary.
Token usage is logged as metrics, and a turn that would pass the goal's token budget is not sent.
The endpoint's dialect, retries and failures are chat_endpoint.py's; the window is the server's
word where it gives one, and the brief, the tools and the first skill must fit it before the first
request. The campaign ends only when the model calls `finish`, or one turn after the stop rule is
met, or at the token budget: a reply without a tool call is answered with a nudge (a few times),
and a model that keeps stopping, or reaches the turn cap, ends the goal as "stopped without
finishing", a failure the thread explains. SIGTERM hands in a short report and exits 0.

One module past 600 lines on purpose, for one conversation's state (its turns, its tokens, its
window, its compactions), which every part of the loop reads and writes; what stands apart from that state lives apart: the
endpoint (chat_endpoint.py), compaction's pure parts (recap.py), the tools (workspace_tools.py,
runner_verbs.py), the brief (briefing.py).

    python -m goaltender.agents.openai_agent

Environment: GOALTENDER_MODEL (required), OPENAI_BASE_URL or GOALTENDER_OPENAI_BASE_URL,
OPENAI_API_KEY or GOALTENDER_OPENAI_API_KEY (default "EMPTY"), GOALTENDER_CONTEXT_TOKENS (the
server's window where it says, else 128000), GOALTENDER_MAX_OUTPUT_TOKENS (per reply; 4096, at most
an eighth of the window), GOALTENDER_TEMPERATURE / GOALTENDER_TOP_P / GOALTENDER_SEED (the
server's defaults), GOALTENDER_MAX_TURNS (200), GOALTENDER_OPENAI_MAX_RETRIES (3), GOALTENDER_OPENAI_TIMEOUT_S (300),
GOALTENDER_SHELL_TIMEOUT_S (600), GOALTENDER_FETCH_TIMEOUT_S (21600), GOALTENDER_TOOL_OUTPUT_CHARS (16000), GOALTENDER_COMPACT_AT
(0.75), GOALTENDER_COMMAND_POLICY (inline JSON or a .json/.toml file; see policy.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from goaltender.agents import briefing, recap
from goaltender.agents.bootstrap import (
    AgentFailure,
    Goal,
    GoalAgent,
    Misconfigured,
    agent_log,
    read_settings,
    run_agent,
)
from goaltender.agents.chat_endpoint import ChatEndpoint, ContextOverflow, EndpointFailure, Sampling
from goaltender.agents.policy import CommandPolicy
from goaltender.agents.runner_verbs import RunnerVerbs, steer_text
from goaltender.agents.tool_output import one_line, redact, secret_values, truncate_middle
from goaltender.agents.tool_schemas import Finish, LoadSkill, Tool, function_tool
from goaltender.agents.workspace_tools import WorkspaceTools
from goaltender.protocol import messages as p
from goaltender.protocol.budget import stop_met
from goaltender.protocol.client import RunnerUnavailable
from goaltender.runner.secrets import url_shown
from goaltender.storage.records import MetricPoint

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion
    from openai.types.chat.chat_completion import Choice
    from openai.types.completion_usage import CompletionUsage

log = agent_log("openai")

PREAMBLE = """\
You are goaltender's built-in research agent. You pursue the goal below as a budgeted campaign on \
this machine: baseline first, then one hypothesis per experiment, each measured and recorded, \
until the stop rule or a budget ends it. You work only by calling the tools you are given; a reply \
without a tool call does nothing.

Rules:
- Run every experiment with run_experiment (never as a bare shell command): that is what puts \
it in the ledger and keeps it within budget. The run prints its headline metric as a final \
`name: value` line.
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

START = (
    "Begin goal #{goal_id}. State your plan in a milestone, then run the baseline with "
    "run_experiment, then one hypothesis per experiment. Write a diary handoff after each "
    "experiment. Call finish with your summary when you are done."
)
RESUME = (
    "You were restarted and are resuming goal #{goal_id}: the conversation before the restart is "
    "gone. The brief above has the ledger so far and your latest diary handoff; check the "
    "workspace, then go on from where the handoff says you were."
)
NUDGE = (
    "You replied without calling a tool, so nothing happened. The campaign goes on until you call "
    "finish ({status}). Call the tool for your next step now, or finish with your summary if "
    "nothing is left worth trying."
)
STOP_MET_NOTE = "The stop rule is met ({status}): call finish now with your summary."
# How the skills' `goaltender <verb>` lines map to this agent's tools.
VERB_TOOLS = {
    "experiment -d <hypothesis> --metric <m> -- <command>": "run_experiment(description, metric, command)",
    "milestone": "milestone",
    "metrics": "log_metrics",
    "ask": "ask_approval",
    "inbox": "read_inbox",
    "diary write": "write_diary",
    "diary read": "read_diary",
    "report": "submit_report (then finish)",
    "nemo-rl": "nemo_rl",
    "fetch": "fetch_from_hub",
}
FIRST_SKILL = "autoresearch"  # what a campaign reads first: it must fit the window with the brief
DEFAULT_WINDOW = 128_000
MAX_NUDGES = 3  # replies in a row without a tool call, each answered, before the agent gives up
REPEATS_NOTED = 3  # the same call (tool and arguments) this many times in the last RECENT_CALLS
RECENT_CALLS = 8  # all of them the same call: the model is stuck, and the goal fails
MIN_REPLY_TOKENS = 64  # a turn that cannot leave the model this much of its token budget is not sent


class AgentConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GOALTENDER_", extra="ignore", env_ignore_empty=True)

    model: str = Field(
        description="name the model the endpoint serves (and set OPENAI_BASE_URL / OPENAI_API_KEY "
        "for the endpoint: vLLM, NIM, OpenAI, ...)"
    )
    base_url: str | None = Field(
        None, validation_alias=AliasChoices("GOALTENDER_OPENAI_BASE_URL", "OPENAI_BASE_URL")
    )
    api_key: str = Field(
        "EMPTY", validation_alias=AliasChoices("GOALTENDER_OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    context_tokens: int | None = Field(None, ge=256)  # None: the server's word, else DEFAULT_WINDOW
    max_output_tokens: int | None = Field(None, ge=16)  # None: 4096, at most a quarter of the window
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    max_turns: int = Field(200, ge=1)
    max_retries: int = Field(3, ge=0, validation_alias="GOALTENDER_OPENAI_MAX_RETRIES")
    timeout_s: float = Field(300.0, ge=0.1, validation_alias="GOALTENDER_OPENAI_TIMEOUT_S")
    shell_timeout_s: float = Field(600.0, ge=0.1)
    fetch_timeout_s: float = Field(6 * 3600.0, ge=0.1)  # a fetch_from_hub call, whole
    output_chars: int = Field(16_000, ge=200, validation_alias="GOALTENDER_TOOL_OUTPUT_CHARS")
    compact_at: float = Field(0.75, ge=0.1, le=0.95)
    command_policy: str | None = None  # inline JSON, or a .json / .toml file (policy.py)
    home: Path | None = None  # the runner's home: a command-policy file there applies by default

    @property
    def endpoint(self) -> str:
        """The endpoint as logs, milestones and reports name it: without credentials in its URL."""
        return url_shown(self.base_url or "https://api.openai.com/v1")

    def output_limit(self, window: int) -> int:
        """Bytes of one tool result: the configured cap, and never more than ~10% of the window."""
        return max(200, min(self.output_chars, window * 4 // 10))

    def reply_tokens(self, window: int) -> int:
        """Tokens one reply may take: the setting, or 4096 and never more than an eighth of the
        window (a small window's room is for the conversation)."""
        return self.max_output_tokens or min(4096, max(16, window // 8))


class OpenAIAgent(GoalAgent):
    def __init__(self, goal: Goal, config: AgentConfig, policy: CommandPolicy):
        super().__init__(goal)
        self.cfg = config
        self.endpoint = ChatEndpoint(
            base_url=config.base_url,
            api_key=config.api_key,
            model=config.model,
            shown=config.endpoint,
            timeout_s=config.timeout_s,
            max_retries=config.max_retries,
            log=log,
        )
        self.window = config.context_tokens or DEFAULT_WINDOW  # the server's word, once asked
        self.secrets = secret_values(os.environ)
        self.workspace_tools = WorkspaceTools(
            goal.workspace,
            policy,
            ask=self._ask,
            shell_timeout_s=config.shell_timeout_s,
            output_limit=config.output_limit(self.window),
            secrets=self.secrets,
        )
        self.verbs = RunnerVerbs(
            goal,
            gate=self.workspace_tools.gate_command,
            ask=self._ask,
            milestone=self.milestone,
            secrets=self.secrets,
            fetch_timeout_s=config.fetch_timeout_s,
        )
        self.tools: dict[str, Tool[Any]] = {}  # the goal's: set by _begin (no training tools on CPU)
        self.tool_specs: list[Any] = []
        self.messages: list[recap.Message] = []
        self.turn = 0
        self.input_total = 0
        self.output_total = 0
        self.token_limit: int | None = None  # the goal's token budget, from the runner's summary
        self.measured: tuple[int, int] | None = None  # (messages counted, tokens) from the last usage
        # What a request costs beyond its messages (the tool schemas, the chat template), measured
        # as the last usage minus our estimate of the messages sent; the schemas' estimate at first.
        self.overhead = 0
        self.compactions = 0
        self.pending_steers: list[p.InboxMessage] = []
        self.recap_lines: list[str] = []
        self.recap_message: recap.Message | None = None
        self.recent_calls: collections.deque[str] = collections.deque(maxlen=RECENT_CALLS)
        self.final_text = ""
        self.finished = False
        self.last_step = ""

    # ---- the loop ----

    async def run(self) -> None:
        await self._learn_window()
        await self._begin()
        log.info(
            "goal #%d: model %s at %s, window %d, %d tools",
            self.goal_id,
            self.cfg.model,
            self.cfg.endpoint,
            self.window,
            len(self.tools),
        )
        ending = await self._converse()
        log.info("done after %d turns: %s", self.turn, ending)
        await self.submit_report(self._report(ending))

    async def _learn_window(self) -> None:
        """The window: the server's word where it gives one (the smaller, when
        GOALTENDER_CONTEXT_TOKENS says more), else the setting, else DEFAULT_WINDOW."""
        said = await self.endpoint.window()
        setting = self.cfg.context_tokens
        if said is not None and (setting is None or said[0] < setting):
            self.window = said[0]
            log.info("the server's window is %d tokens (%s)", said[0], said[1])
        elif setting is None:
            log.info(
                "the server does not say its window: assuming %d tokens (set GOALTENDER_CONTEXT_TOKENS)",
                DEFAULT_WINDOW,
            )
        self.workspace_tools.output_limit = self.cfg.output_limit(self.window)

    async def _begin(self) -> None:
        """The tools the goal needs, the brief (system message) and the first instruction, checked
        to fit the window; after a restart, the steering so far: read messages into the brief,
        unread ones as messages."""
        summary = await self._summary()
        handoff = await self._handoff()
        models = briefing.needs_models(summary.status.goal)
        tools = [tool for tool in self.workspace_tools.tools() if tool.name != "load_skill"]
        tools += [Tool("load_skill", LoadSkill, self._load_skill), *self.verbs.tools(models=models)]
        tools.append(Tool("finish", Finish, self.finish))
        self.tools = {tool.name: tool for tool in tools}
        self.tool_specs = [function_tool(tool) for tool in tools]
        self.overhead = recap.estimate_tokens(self.tool_specs)
        briefing.prepare_workspace(self.workspace, briefing.goal_brief(summary, handoff))
        if self.goal.resumed:
            inbox = await self.runner.request(p.ReadInbox(goal_id=self.goal_id, all=True))
            for message in inbox.messages:
                if message.read_at is None:
                    self.pending_steers.append(message)
                else:
                    self.verbs.steers.append(steer_text(message))
        self.messages = [
            {"role": "system", "content": self._system_text(summary, handoff)},
            {
                "role": "user",
                "content": (RESUME if self.goal.resumed else START).format(goal_id=self.goal_id),
            },
        ]
        self._check_fit()
        if self.goal.resumed:
            await self.milestone(
                "Resumed after a restart",
                "The brief was rebuilt from the runner's ledger"
                + (" and the diary's latest handoff" if handoff else " (no diary handoff found)")
                + f"; {len(summary.ledger)} experiments so far.",
            )

    def _check_fit(self) -> None:
        """Refuse to start, with the numbers, when the brief, the tools, the first skill and room
        for a reply do not fit the window: the first request would fail, or the skill be cut."""
        parts = {
            "the brief": recap.estimate_tokens(self.messages),
            "the tools": recap.estimate_tokens(self.tool_specs),
            "room for a reply": self.cfg.reply_tokens(self.window),
        }
        with contextlib.suppress(KeyError):
            parts[f"the `{FIRST_SKILL}` skill"] = recap.estimate_tokens(briefing.load_skill(FIRST_SKILL))
        need = sum(parts.values())
        log.info("the first request: %s", ", ".join(f"{k} ~{v}" for k, v in parts.items()))
        if need > self.window:
            said = ", ".join(f"{name} ~{tokens:,}" for name, tokens in parts.items())
            raise AgentFailure(
                f"The model's window ({self.window:,} tokens) is too small for this goal: it needs ~{need:,}",
                f"Before its first reply the agent needs {said}. Serve the model with a longer context "
                "(llama.cpp: --ctx-size; vLLM: --max-model-len; Ollama: num_ctx) and set "
                "GOALTENDER_CONTEXT_TOKENS to it, or lower GOALTENDER_MAX_OUTPUT_TOKENS.",
            )

    async def _converse(self) -> str:
        """Turns until the model calls finish, one turn past a met stop rule, or the token budget;
        returns why it ended. A model that keeps replying without tools, or reaches the turn cap,
        fails the goal: it stopped without finishing."""
        quiet = 0  # replies in a row without a tool call
        told_stop = False
        while self.turn < self.cfg.max_turns:
            await self._inject_inbox()
            if self.context_tokens() > self.cfg.compact_at * self.window:
                await self.compact()
            reply_tokens = self._reply_tokens()
            if reply_tokens is None:
                return self._token_budget_end()
            choice, calls = await self._next_turn(reply_tokens)
            if choice.finish_reason == "content_filter":
                raise EndpointFailure(
                    f"Model endpoint's content filter refused the reply: {self.cfg.endpoint}",
                    f"finish_reason content_filter at turn {self.turn}; model {self.cfg.model}",
                )
            if not calls:
                quiet += 1
                if quiet > MAX_NUDGES:
                    raise self._stopped(f"it replied {quiet} times in a row without calling a tool")
                if choice.finish_reason == "length":
                    self._say("Your reply hit the output limit; go on, more briefly, with a tool call.")
                else:
                    self._say(
                        NUDGE.format(status=self.verbs.stop_status or "see the brief for the stop rule")
                    )
                continue
            quiet = 0
            for call_id, name, arguments in calls:
                result = await self._execute(name, arguments)
                self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            if self.finished:
                return "the model called finish"
            if stop_met(self.verbs.stop_status):
                if told_stop:
                    return f"the stop rule was met ({self.verbs.stop_status})"
                told_stop = True
                self._say(STOP_MET_NOTE.format(status=self.verbs.stop_status))
        raise self._stopped(f"it reached the turn cap ({self.cfg.max_turns}, GOALTENDER_MAX_TURNS)")

    def _stopped(self, how: str) -> AgentFailure:
        last = f" Its last words: {one_line(self.final_text, 600)}" if self.final_text else ""
        return AgentFailure(
            "The agent stopped without finishing",
            f"The model never called finish: {how}, with the campaign still open "
            f"({self.verbs.stop_status or 'no experiment yet'}).{last}",
        )

    def _say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def _reply_tokens(self) -> int | None:
        """What the next reply may take: the setting, cut to what the goal's token budget leaves
        after the request itself; None when that is too little to send it."""
        tokens = self.cfg.reply_tokens(self.window)
        if self.token_limit is None:
            return tokens
        left = self.token_limit - self.input_total - self.output_total - self.context_tokens()
        return min(tokens, left) if left >= MIN_REPLY_TOKENS else None

    def _token_budget_end(self) -> str:
        used = self.input_total + self.output_total
        text = (
            f"**Stopped at the token budget:** {used:,} of {self.token_limit:,} tokens used; the next "
            f"turn needs ~{self.context_tokens():,} more."
        )
        self.final_text = f"{text}\n\n{self.final_text}" if self.final_text else text
        return f"the token budget ({used:,}/{self.token_limit:,} tokens)"

    async def _next_turn(self, reply_tokens: int) -> tuple[Choice, list[tuple[str, str, str]]]:
        """One model reply, recorded; returns it with its tool calls as (id, name, arguments)."""
        response = await self._complete(reply_tokens)
        self.turn += 1
        choice = response.choices[0]
        message = choice.message
        calls = _function_calls(message.tool_calls or [], self.turn)
        # Always a string: llama.cpp's server (and others) refuse an assistant turn with null content.
        assistant: recap.Message = {"role": "assistant", "content": message.content or ""}
        if calls:
            assistant["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                for call_id, name, arguments in calls
            ]
        self.messages.append(assistant)
        await self._account(response.usage)
        if message.content:
            self.final_text = message.content
        return choice, calls

    def _report(self, ending: str) -> str:
        parts = [t.strip() for t in (self.verbs.report_text, self.final_text) if t and t.strip()]
        if len(parts) == 2 and parts[1] in parts[0]:
            parts = parts[:1]
        return "\n\n".join(parts) or f"The agent ended without a summary ({ending})."

    async def _complete(self, reply_tokens: int) -> ChatCompletion:
        """A usable reply. A request the server finds too long is compacted below what it refused,
        as long as each compaction shrinks it; other failures are the endpoint's (chat_endpoint.py)."""
        refused_at: int | None = None
        while True:
            sampling = Sampling(reply_tokens, self.cfg.temperature, self.cfg.top_p, self.cfg.seed)
            try:
                return await self.endpoint.complete(self.messages, self.tool_specs, sampling)
            except ContextOverflow as overflow:
                size = self.context_tokens()
                if overflow.window and overflow.window < self.window:
                    log.info(
                        "the server's window is %d tokens, not %d: %s", overflow.window, self.window, overflow
                    )
                    self.window = overflow.window
                    self.workspace_tools.output_limit = self.cfg.output_limit(self.window)
                    reply_tokens = min(reply_tokens, self.cfg.reply_tokens(self.window))
                if refused_at is not None and size >= refused_at:
                    raise EndpointFailure(
                        f"Model endpoint refused the request as too long, even compacted: {self.cfg.endpoint}",
                        f"The server said: {overflow}\nThe request was ~{size:,} tokens, window {self.window:,}.",
                    ) from None
                refused_at = size
                # The server counted more than we estimate: aim lower by as much.
                scale = max(1.0, (overflow.prompt or 0) / max(1, size))
                log.info("the endpoint refused the request as too long (%s); compacting", overflow)
                await self.compact(target=int(min(size, self.window - reply_tokens) / scale * 0.6))

    async def _account(self, usage: CompletionUsage | None) -> None:
        """Token usage as metric series; the measured size of the context for the next turn."""
        if usage is not None and getattr(usage, "prompt_tokens", None) is not None:
            prompt, completion = usage.prompt_tokens, usage.completion_tokens or 0
            self.overhead = prompt - recap.estimate_tokens(self.messages[:-1])
        else:
            prompt = recap.estimate_tokens(self.messages[:-1])
            completion = recap.estimate_tokens(self.messages[-1])
        self.measured = (len(self.messages), prompt + completion)
        self.input_total += prompt
        self.output_total += completion
        points = [
            MetricPoint(name="agent/input_tokens", value=self.input_total, step=self.turn),
            MetricPoint(name="agent/output_tokens", value=self.output_total, step=self.turn),
            MetricPoint(name="agent/context_tokens", value=prompt + completion, step=self.turn),
        ]
        try:
            await self.runner.request(p.LogMetrics(goal_id=self.goal_id, points=points))
        except p.ProtocolError as exc:
            log.info("could not log token metrics: %s", exc)

    def context_tokens(self) -> int:
        """Tokens the next request will carry: the last measured usage plus estimates of what came
        after it; before any reply (or after a compaction), an estimate of everything."""
        if self.measured is not None and self.measured[0] <= len(self.messages):
            count, tokens = self.measured
            return tokens + (
                recap.estimate_tokens(self.messages[count:]) if count < len(self.messages) else 0
            )
        return recap.estimate_tokens(self.messages) + self.overhead

    # ---- steering and the brief ----

    async def _inject_inbox(self) -> None:
        messages, self.pending_steers = self.pending_steers, []
        try:
            messages += (await self.runner.request(p.ReadInbox(goal_id=self.goal_id))).messages
        except p.ProtocolError as exc:
            log.info("could not read the inbox: %s", exc)
        for message in messages:
            text = steer_text(message)
            self.verbs.steers.append(text)
            self._say(text)
            log.info("steer: %s", one_line(text, 200))

    def _system_text(self, summary: p.SummaryReply, handoff: str | None) -> str:
        parts = [PREAMBLE, briefing.goal_brief(summary, handoff, terms="tools")]
        if skills := dict.fromkeys(self.workspace_tools.loaded_skills):
            parts.append(
                "## Skills you loaded\n\n"
                + "\n".join(f"- `{name}`" for name in skills)
                + "\n\n(load_skill again for their full text.)"
            )
        if self.verbs.steers:
            parts.append(
                "## Steering from people so far (oldest first; it still applies)\n\n"
                + "\n".join(f"- {one_line(s, 600)}" for s in self.verbs.steers[-20:])
            )
        return "\n\n".join(part.strip() for part in parts) + "\n"

    async def _summary(self) -> p.SummaryReply:
        summary = await self.runner.request(p.Summary(goal_id=self.goal_id))
        self.token_limit = summary.status.goal.budget.max_tokens
        self.verbs.stop_status = summary.status.stop_status
        return summary

    async def _handoff(self) -> str | None:
        diary = await self.runner.request(p.ReadDiary(goal_id=self.goal_id, last=1, kind="handoff"))
        return diary.entries[-1].text if diary.entries else None

    async def compact(self, target: int | None = None) -> None:
        """Replace older turns by a recap; rebuild the brief from a fresh runner summary and the
        diary's latest handoff. The request shrinks to `target` tokens (half the window by
        default): the latest turns verbatim in half of what the brief and tools leave, the recap
        in the rest; less of each while it does not fit. A brief and tools alone past the target
        fail the goal."""
        before = self.context_tokens()
        summary = await self._summary()
        handoff = await self._handoff()
        target = target or self.window // 2
        system: recap.Message = {"role": "system", "content": self._system_text(summary, handoff)}
        room = target - recap.estimate_tokens(system) - self.overhead
        if room < 100:
            raise EndpointFailure(
                f"The model's window ({self.window:,} tokens) cannot hold the brief and the tools",
                f"They take ~{target - room:,} tokens where the request must shrink to ~{target:,}. Serve "
                "the model with a longer context and set GOALTENDER_CONTEXT_TOKENS to it.",
            )
        history = [m for m in self.messages[1:] if m is not self.recap_message]
        self.compactions += 1
        ledger = summary.text if summary.ledger else None
        for share in (2, 4, 0):  # of the room, for the latest turns kept verbatim
            lines, kept, recapped = recap.compact(history, room // share if share else 0)
            text = recap.recap_text(
                self.recap_lines + lines,
                ledger,
                turn=self.turn,
                compactions=self.compactions,
                budget_chars=(room - recap.estimate_tokens(kept)) * 4,
            )
            message: recap.Message = {"role": "user", "content": text}
            if recap.estimate_tokens([message, *kept]) <= room:
                break
        self.recap_lines += lines
        self.recap_message = message
        self.messages = [system, message, *kept]
        self.measured = None
        log.info(
            "compacted the context: ~%d -> ~%d tokens (window %d), %d turns recapped",
            before,
            self.context_tokens(),
            self.window,
            recapped,
        )
        with contextlib.suppress(p.ProtocolError):
            point = MetricPoint(name="agent/compactions", value=self.compactions, step=self.turn)
            await self.runner.request(p.LogMetrics(goal_id=self.goal_id, points=[point]))

    # ---- tools ----

    async def _execute(self, name: str, raw_arguments: str) -> str:
        tool = self.tools.get(name)
        if tool is None:
            return f"error: there is no tool {name!r}; the tools are: {', '.join(self.tools)}"
        try:
            arguments = _json_object(raw_arguments)
        except ValueError as exc:
            return f"error: the arguments of {name} are not valid JSON ({exc}); send a JSON object"
        self.last_step = f"{name}({one_line(raw_arguments, 200)})"
        log.info("turn %d: %s", self.turn, self.last_step)
        try:
            result = await self._run_tool(tool, arguments)
        except p.ProtocolError as exc:
            result = f"error: the runner refused {name}: {exc.error.code}: {exc.error.message}"
            if exc.error.code in ("budget_exhausted", "conflict"):
                result += "\nThe campaign cannot go on: submit your report and call finish."
        except RunnerUnavailable:
            raise
        except Exception as exc:  # a tool failure is the model's business, never the loop's
            result = f"error: {name} failed: {type(exc).__name__}: {exc}"
        # A skill is instructions, useless cut: it may take half the window (_check_fit made room).
        limit = self.window * 2 if name == "load_skill" else self.cfg.output_limit(self.window)
        return truncate_middle(result, limit, self.secrets) + self._repeated(name, arguments)

    def _repeated(self, name: str, arguments: dict[str, Any]) -> str:
        """A note when the model makes the same call again and again: a loop it may not see."""
        key = f"{name} {json.dumps(arguments, sort_keys=True)}"
        self.recent_calls.append(key)
        count = self.recent_calls.count(key)
        if count < REPEATS_NOTED:
            return ""
        if count == RECENT_CALLS:
            raise self._stopped(f"it was stuck, making the same {name} call {count} times in a row")
        log.info("turn %d: the same %s call %d times in the last %d", self.turn, name, count, RECENT_CALLS)
        return (
            f"\n\nnote: this is the same {name} call, with the same arguments, {count} times in your last "
            f"{len(self.recent_calls)} calls; its result will not change. Do something different, or "
            "call finish."
        )

    @staticmethod
    async def _run_tool(tool: Tool[Any], arguments: dict[str, Any]) -> str:
        try:
            valid = tool.arguments.model_validate(arguments)
        except ValidationError as exc:
            return f"error: bad arguments for {tool.name}: {_validation_text(exc)}"
        return await tool.run(valid)

    async def _ask(self, question: str, detail: str, kind: str) -> p.Approval:
        reply = await self.runner.request(
            p.Ask(goal_id=self.goal_id, question=question[:3000], detail=detail[:20_000], kind=kind)
        )
        return reply.approval

    async def milestone(self, title: str, text: str = "") -> str:
        return await super().milestone(redact(title, self.secrets), redact(text, self.secrets))

    async def _load_skill(self, args: LoadSkill) -> str:
        """A skill, with how its `goaltender <verb>` lines map to this agent's tools."""
        text = await self.workspace_tools.load_skill(args)
        if text.startswith("error:"):
            return text
        verbs = [
            f"`goaltender {verb}` is {tool}"
            for verb, tool in VERB_TOOLS.items()
            if tool.split("(")[0].split()[0] in self.tools
        ]
        return (
            f"(Skills are written for the goaltender CLI; you have its verbs as tools: {'; '.join(verbs)}; "
            "other `goaltender` verbs run in the shell.)\n\n" + text
        )

    async def finish(self, args: Finish) -> str:
        self.finished = True
        self.final_text = args.summary
        return "finishing: the report is being handed in"

    # ---- endings ----

    async def stop(self) -> None:
        """Stopped by the runner: the short report, fast."""
        lines = [f"**Stopped** by the runner after {self.turn} model turns."]
        if self.last_step:
            lines.append(f"**Last step:** {self.last_step}")
        if self.verbs.report_text:
            lines.append(self.verbs.report_text.strip())
        elif self.final_text:
            lines.append(f"**Last note from the model:** {one_line(self.final_text, 1500)}")
        await self.submit_report("\n\n".join(lines))

    async def fail(self, failure: AgentFailure) -> None:
        endpoint = isinstance(failure, EndpointFailure)
        why = "The goal fails: the agent cannot work without its model." if endpoint else "The goal fails."
        await asyncio.wait_for(self.milestone(failure.title, f"{failure.detail}\n{why}".strip()), 5)
        report = f"**The agent failed:** {failure.title}.\n\n{failure.detail}\n\n{self._report('it failed')}"
        await asyncio.wait_for(self.submit_report(report), 5)

    async def close(self) -> None:
        await self.workspace_tools.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.endpoint.close(), 2)


def _function_calls(tool_calls: list[Any], turn: int) -> list[tuple[str, str, str]]:
    """(id, name, arguments JSON) of each function call (the endpoint checked each has a name);
    ids made up where the server sent none."""
    return [
        (getattr(call, "id", None) or f"call_{turn}_{i}", call.function.name, _arguments_text(call.function))
        for i, call in enumerate(tool_calls)
        if getattr(call, "type", None) in ("function", None)
    ]


def _arguments_text(function: Any) -> str:
    """A tool call's arguments as JSON text; some servers send a JSON object instead of a string."""
    arguments = getattr(function, "arguments", None)
    if arguments is None or arguments == "":
        return "{}"
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _json_object(raw: str) -> dict[str, Any]:
    arguments = json.loads(raw)
    if not isinstance(arguments, dict):
        raise ValueError("the arguments must be a JSON object")
    return arguments


def _validation_text(exc: ValidationError) -> str:
    """'command: Field required; timeout_s: Input should be a valid number': the first problem of
    each argument."""
    problems: dict[str, str] = {}
    for error in exc.errors():
        problems.setdefault(str(error["loc"][0]) if error["loc"] else "arguments", error["msg"])
    return "; ".join(f"{name}: {problem}" for name, problem in problems.items())


def build(goal: Goal) -> OpenAIAgent:
    config = read_settings(AgentConfig)
    try:
        policy = CommandPolicy.load(config.command_policy, config.home)
    except (ValueError, OSError) as exc:
        raise Misconfigured(f"{type(exc).__name__}: {exc}") from exc
    return OpenAIAgent(goal, config, policy)


def main() -> None:
    run_agent("openai", "The built-in agent", build)


if __name__ == "__main__":
    main()
