"""The built-in agent: a tool-calling loop on any OpenAI-compatible Chat Completions endpoint.

The runner starts it for a goal (see bootstrap.py). The model gets the goal's brief as its system
message and works through function tools (tool_schemas.py): a shell and file tools in the
workspace (workspace_tools.py; risky commands wait for a person's approval, see policy.py), the
skills, every runner verb (runner_verbs.py: run an experiment, milestone, metrics, ask, inbox,
diary, report), and `finish`.

Each turn boundary: steering from the inbox becomes user messages; when the conversation passes
~75% of the context window, older turns are replaced by a recap (recap.py) and the brief (goal,
stop rule, budgets, skills, the diary's latest handoff) is rebuilt from a fresh runner summary.
Token usage is logged as metrics. A dead endpoint fails the goal with a clear message, and so do
a request past GOALTENDER_OPENAI_TIMEOUT_S (the whole request, not each read), a malformed reply
(after the retries) and a content-filter refusal; SIGTERM
hands in a short report and exits 0; no tool calls (or `finish`) ends the campaign with the
model's summary.

    python -m goaltender.agents.openai_agent

Environment: GOALTENDER_MODEL (required), OPENAI_BASE_URL or GOALTENDER_OPENAI_BASE_URL,
OPENAI_API_KEY or GOALTENDER_OPENAI_API_KEY (default "EMPTY"), GOALTENDER_CONTEXT_TOKENS (128000),
GOALTENDER_MAX_TURNS (200), GOALTENDER_OPENAI_MAX_RETRIES (3), GOALTENDER_OPENAI_TIMEOUT_S (300),
GOALTENDER_SHELL_TIMEOUT_S (600), GOALTENDER_FETCH_TIMEOUT_S (21600), GOALTENDER_TOOL_OUTPUT_CHARS (16000), GOALTENDER_COMPACT_AT
(0.75), GOALTENDER_COMMAND_POLICY (inline JSON or a .json/.toml file; see policy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

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
from goaltender.agents.policy import CommandPolicy
from goaltender.agents.runner_verbs import RunnerVerbs, steer_text
from goaltender.agents.tool_output import one_line, redact, secret_values, truncate_middle
from goaltender.agents.tool_schemas import Finish, Tool, function_tool
from goaltender.agents.workspace_tools import WorkspaceTools
from goaltender.runner import protocol as p
from goaltender.runner.client import RunnerUnavailable
from goaltender.runner.secrets import url_shown
from goaltender.storage.records import MetricPoint

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
    from openai.types.chat.chat_completion import Choice
    from openai.types.completion_usage import CompletionUsage

log = agent_log("openai")

PREAMBLE = """\
You are goaltender's built-in research agent. You pursue the goal below as a budgeted campaign on \
this machine: baseline first, then one hypothesis per experiment, each measured and recorded, \
until the stop rule or a budget ends it. You work through function tools; the brief's \
`goaltender <verb>` commands are these tools: `goaltender experiment` = run_experiment, \
`milestone` = milestone, `metrics` = log_metrics, `ask` = ask_approval, `inbox` = read_inbox, \
`diary` = write_diary / read_diary, `report` = submit_report, `nemo-rl` = nemo_rl, `fetch` = \
fetch_from_hub; the others (`goaltender doctor`, `goaltender preflight`) run in the shell. Also: \
shell, read_file, write_file, edit_file, list_files, load_skill, and finish.

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
    context_tokens: int = Field(128_000, ge=256)
    max_turns: int = Field(200, ge=1)
    max_retries: int = Field(3, ge=0, validation_alias="GOALTENDER_OPENAI_MAX_RETRIES")
    timeout_s: float = Field(300.0, ge=0.1, validation_alias="GOALTENDER_OPENAI_TIMEOUT_S")
    shell_timeout_s: float = Field(600.0, ge=0.1)
    fetch_timeout_s: float = Field(6 * 3600.0, ge=0.1)  # a fetch_from_hub call, whole
    output_chars: int = Field(16_000, ge=200, validation_alias="GOALTENDER_TOOL_OUTPUT_CHARS")
    compact_at: float = Field(0.75, ge=0.1)
    command_policy: str | None = None  # inline JSON, or a .json / .toml file (policy.py)
    home: Path | None = None  # the runner's home: a command-policy file there applies by default

    @property
    def endpoint(self) -> str:
        """The endpoint as logs, milestones and reports name it: without credentials in its URL."""
        return url_shown(self.base_url or "https://api.openai.com/v1")

    @property
    def output_limit(self) -> int:
        """Bytes of one tool result: the configured cap, and never more than ~10% of the window."""
        return max(200, min(self.output_chars, self.context_tokens * 4 // 10))


class EndpointFailure(AgentFailure):
    """The model endpoint cannot serve us: the goal fails with this message."""


class MalformedReply(Exception):
    """A 200 from the endpoint that is not a usable chat completion (said as 'a reply without ...')."""


class OpenAIAgent(GoalAgent):
    def __init__(self, goal: Goal, config: AgentConfig, policy: CommandPolicy):
        import openai  # slow to import: after the signal handlers and the runner connection

        super().__init__(goal)
        self.cfg = config
        self.client = openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key,
            max_retries=config.max_retries,
            timeout=openai.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
        )
        self.secrets = secret_values(os.environ)
        self.workspace_tools = WorkspaceTools(
            goal.workspace,
            policy,
            ask=self._ask,
            shell_timeout_s=config.shell_timeout_s,
            output_limit=config.output_limit,
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
        tools = [*self.workspace_tools.tools(), *self.verbs.tools(), Tool("finish", Finish, self.finish)]
        self.tools = {tool.name: tool for tool in tools}
        self.tool_specs = [function_tool(tool) for tool in tools]
        self.messages: list[recap.Message] = []
        self.turn = 0
        self.input_total = 0
        self.output_total = 0
        self.measured: tuple[int, int] | None = None  # (messages counted, tokens) from the last usage
        # What a request costs beyond its messages (the tool schemas, the chat template), measured
        # as the last usage minus our estimate of the messages sent; the schemas' estimate at first.
        self.overhead = recap.estimate_tokens(self.tool_specs)
        self.compactions = 0
        self.pending_steers: list[p.InboxMessage] = []
        self.recap_lines: list[str] = []
        self.recap_message: recap.Message | None = None
        self.final_text = ""
        self.finished = False
        self.last_step = ""

    # ---- the loop ----

    async def run(self) -> None:
        await self._begin()
        log.info(
            "goal #%d: model %s at %s, window %d",
            self.goal_id,
            self.cfg.model,
            self.cfg.endpoint,
            self.cfg.context_tokens,
        )
        ending = await self._converse()
        log.info("done after %d turns: %s", self.turn, ending)
        await self.submit_report(self._report(ending))

    async def _begin(self) -> None:
        """The brief (system message) and the first instruction; after a restart, the steering
        so far: read messages into the brief, unread ones as messages."""
        summary = await self._summary()
        handoff = await self._handoff()
        briefing.prepare_workspace(self.workspace, briefing.goal_brief(summary, handoff))
        if self.goal.resumed:
            inbox = await self.runner.call(p.ReadInbox, p.InboxReply, goal_id=self.goal_id, all=True)
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
        if self.goal.resumed:
            await self.milestone(
                "Resumed after a restart",
                "The brief was rebuilt from the runner's ledger"
                + (" and the diary's latest handoff" if handoff else " (no diary handoff found)")
                + f"; {len(summary.ledger)} experiments so far.",
            )

    async def _converse(self) -> str:
        """Turns until the model is done or the turn cap; returns why it ended."""
        nudged = False
        while self.turn < self.cfg.max_turns:
            await self._inject_inbox()
            if self.context_tokens() > self.cfg.compact_at * self.cfg.context_tokens:
                await self.compact()
            choice, calls = await self._next_turn()
            if choice.finish_reason == "content_filter":
                raise EndpointFailure(
                    f"Model endpoint's content filter refused the reply: {self.cfg.endpoint}",
                    f"finish_reason content_filter at turn {self.turn}; model {self.cfg.model}",
                )
            if not calls:
                if choice.finish_reason == "length":
                    self._say("Your reply hit the output limit; go on, more briefly.")
                    continue
                if not (choice.message.content or "").strip() and not nudged:
                    nudged = True
                    self._say("You replied with nothing. Go on with the next step, or call finish.")
                    continue
                return "the model gave its final answer"
            for call_id, name, arguments in calls:
                result = await self._execute(name, arguments)
                self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            if self.finished:
                return "the model called finish"
        cap = f"**Stopped after {self.turn} model turns** (the GOALTENDER_MAX_TURNS cap)."
        self.final_text = f"{cap}\n\n{self.final_text}" if self.final_text else cap
        return f"the turn cap ({self.cfg.max_turns}) was reached"

    def _say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    async def _next_turn(self) -> tuple[Choice, list[tuple[str, str, str]]]:
        """One model reply, recorded; returns it with its tool calls as (id, name, arguments)."""
        response = await self._complete()
        self.turn += 1
        choice = response.choices[0]
        message = choice.message
        calls = _function_calls(message.tool_calls or [], self.turn)
        assistant: recap.Message = {
            "role": "assistant",
            "content": message.content or ("" if not calls else None),
        }
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

    async def _complete(self) -> ChatCompletion:
        """A usable reply. The SDK retries HTTP errors; here, a request past its deadline (a
        trickling endpoint never trips the per-read timeout) and a malformed 200 are retried up to
        GOALTENDER_OPENAI_MAX_RETRIES times, then the goal fails saying which."""
        import openai

        retried_context = False
        failures = 0
        while True:
            try:
                async with asyncio.timeout(self.cfg.timeout_s):
                    response = await self.client.chat.completions.create(
                        model=self.cfg.model,
                        messages=cast("list[ChatCompletionMessageParam]", self.messages),
                        tools=self.tool_specs,
                        tool_choice="auto",
                    )
                if problem := _reply_problem(response):
                    raise MalformedReply(problem)
                return response
            except (TimeoutError, MalformedReply, json.JSONDecodeError) as exc:
                failures += 1
                if failures > self.cfg.max_retries:
                    raise self._gave_up(exc) from exc
                log.info("retrying the request (%d of %d): %s", failures, self.cfg.max_retries, exc)
                await asyncio.sleep(min(8.0, 0.5 * 2 ** (failures - 1)))
            except openai.BadRequestError as exc:
                text = str(exc).lower()
                if retried_context or not any(w in text for w in ("context", "too long", "maximum", "token")):
                    raise EndpointFailure(
                        f"Model endpoint refused the request: {self.cfg.endpoint}: {exc}"
                    ) from exc
                log.info("the endpoint refused the request as too long; compacting (%s)", exc)
                retried_context = True
                await self.compact(force=True)
            except openai.APIConnectionError as exc:  # also APITimeoutError
                raise EndpointFailure(
                    f"Model endpoint unreachable: {self.cfg.endpoint}: {_error_text(exc)}",
                    f"after {self.cfg.max_retries} retries; the model was {self.cfg.model}",
                ) from exc
            except openai.APIStatusError as exc:
                unreachable = exc.status_code == 429 or exc.status_code >= 500
                how = "unreachable" if unreachable else "refused the request"
                raise EndpointFailure(
                    f"Model endpoint {how}: {self.cfg.endpoint}: {_error_text(exc)}",
                    f"HTTP {exc.status_code} after {self.cfg.max_retries} retries; model {self.cfg.model}",
                ) from exc

    def _gave_up(self, exc: Exception) -> EndpointFailure:
        """Why the endpoint could not answer, once the retries are used up."""
        after = f"after {self.cfg.max_retries} retries; model {self.cfg.model}"
        if isinstance(exc, TimeoutError):
            return EndpointFailure(
                f"Model endpoint unreachable: {self.cfg.endpoint}: no complete answer within "
                f"{self.cfg.timeout_s:g}s (GOALTENDER_OPENAI_TIMEOUT_S)",
                after,
            )
        what = str(exc) if isinstance(exc, MalformedReply) else f"a reply that is not valid JSON ({exc})"
        return EndpointFailure(f"Model endpoint returned {what}: {self.cfg.endpoint}", after)

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
            await self.runner.call(p.LogMetrics, p.Done, goal_id=self.goal_id, points=points)
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
            messages += (await self.runner.call(p.ReadInbox, p.InboxReply, goal_id=self.goal_id)).messages
        except p.ProtocolError as exc:
            log.info("could not read the inbox: %s", exc)
        for message in messages:
            text = steer_text(message)
            self.verbs.steers.append(text)
            self._say(text)
            log.info("steer: %s", one_line(text, 200))

    def _system_text(self, summary: p.SummaryReply, handoff: str | None) -> str:
        parts = [PREAMBLE, briefing.goal_brief(summary, handoff)]
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
        return await self.runner.call(p.Summary, p.SummaryReply, goal_id=self.goal_id)

    async def _handoff(self) -> str | None:
        diary = await self.runner.call(
            p.ReadDiary, p.DiaryReply, goal_id=self.goal_id, last=1, kind="handoff"
        )
        return diary.entries[-1].text if diary.entries else None

    async def compact(self, force: bool = False) -> None:
        """Replace older turns by a recap; rebuild the brief from a fresh runner summary and the
        diary's latest handoff. The latest turns stay verbatim (up to ~25% of the window)."""
        before = self.context_tokens()
        summary = await self._summary()
        handoff = await self._handoff()
        window = self.cfg.context_tokens
        history = [m for m in self.messages[1:] if m is not self.recap_message]
        lines, kept, recapped = recap.compact(history, window, force)
        self.recap_lines += lines
        self.compactions += 1
        ledger = summary.text if summary.ledger else None
        text = recap.recap_text(
            self.recap_lines, ledger, turn=self.turn, compactions=self.compactions, window=window
        )
        self.recap_message = {"role": "user", "content": text}
        self.messages = [
            {"role": "system", "content": self._system_text(summary, handoff)},
            self.recap_message,
            *kept,
        ]
        self.measured = None
        log.info(
            "compacted the context: ~%d -> ~%d tokens (window %d), %d turns recapped",
            before,
            self.context_tokens(),
            window,
            recapped,
        )
        with contextlib.suppress(p.ProtocolError):
            point = MetricPoint(name="agent/compactions", value=self.compactions, step=self.turn)
            await self.runner.call(p.LogMetrics, p.Done, goal_id=self.goal_id, points=[point])

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
        return truncate_middle(result, self.cfg.output_limit, self.secrets)

    @staticmethod
    async def _run_tool(tool: Tool[Any], arguments: dict[str, Any]) -> str:
        try:
            valid = tool.arguments.model_validate(arguments)
        except ValidationError as exc:
            return f"error: bad arguments for {tool.name}: {_validation_text(exc)}"
        return await tool.run(valid)

    async def _ask(self, question: str, detail: str, kind: str) -> p.Approval:
        reply = await self.runner.call(
            p.Ask,
            p.DecisionReply,
            goal_id=self.goal_id,
            question=question[:3000],
            detail=detail[:20_000],
            kind=kind,
        )
        return reply.approval

    async def milestone(self, title: str, text: str = "") -> str:
        return await super().milestone(redact(title, self.secrets), redact(text, self.secrets))

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
        detail = (
            f"{failure.title}\n{failure.detail}\nThe goal fails: the agent cannot work without its model."
        )
        await asyncio.wait_for(self.milestone(failure.title, detail), 5)
        report = f"**The agent failed:** {failure.title}.\n\n{self._report('the endpoint failed')}"
        await asyncio.wait_for(self.submit_report(report), 5)

    async def close(self) -> None:
        await self.workspace_tools.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.close(), 2)


def _reply_problem(response: Any) -> str | None:
    """What makes a reply unusable ("a reply without choices", ...), or None. The SDK does not
    validate replies: a proxy's page, or a server's odd JSON, arrives as is."""
    choices = getattr(response, "choices", None)
    if not choices or not isinstance(choices, list):
        return f"a reply without choices ({one_line(response, 200)})"
    message = getattr(choices[0], "message", None)
    if message is None:
        return "a choice without a message"
    for call in getattr(message, "tool_calls", None) or []:
        function = getattr(call, "function", None)
        if not isinstance(getattr(function, "name", None), str):
            return "a tool call without a function name"
    return None


def _function_calls(tool_calls: list[Any], turn: int) -> list[tuple[str, str, str]]:
    """(id, name, arguments JSON) of each function call (_reply_problem checked each has a name);
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


def _error_text(exc: BaseException) -> str:
    """The exception and its causes, e.g. 'Connection error. (ConnectError: [Errno 111] ...)'."""
    text = str(exc) or type(exc).__name__
    cause, seen = exc.__cause__ or exc.__context__, 0
    while cause is not None and seen < 4:
        if str(cause) and str(cause) not in text:
            text += f" ({type(cause).__name__}: {cause})"
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return one_line(text, 500)


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
