"""The built-in agent: a tool-calling loop on any OpenAI-compatible Chat Completions endpoint.

The runner starts it for a goal (see bootstrap.py; cwd = the workspace). The model gets the goal's
brief as its system message and works through function tools (tool_specs.py): a shell and file
tools in the workspace (workspace_tools.py; risky commands wait for a person's approval, see
policy.py), the skills, and every runner verb (runner_tools.py: run an experiment, milestone,
metrics, ask, inbox, diary, report) plus `finish`.

Each turn boundary: steering from the inbox becomes user messages; when the conversation passes
~75% of the context window, older turns are replaced by a recap (recap.py) and the brief (goal,
stop rule, budgets, skills, the diary's latest handoff) is rebuilt from a fresh runner summary.
Token usage is logged as metrics. A dead endpoint fails the goal with a clear message; SIGTERM
hands in a short report and exits 0; no tool calls (or `finish`) ends the campaign with the
model's summary.

    python -m goaltender.agents.openai_agent

Environment (settings.py): GOALTENDER_MODEL (required), OPENAI_BASE_URL or
GOALTENDER_OPENAI_BASE_URL, OPENAI_API_KEY or GOALTENDER_OPENAI_API_KEY (default "EMPTY"),
GOALTENDER_CONTEXT_TOKENS (128000), GOALTENDER_MAX_TURNS (200), GOALTENDER_OPENAI_MAX_RETRIES (3),
GOALTENDER_OPENAI_TIMEOUT_S (300), GOALTENDER_SHELL_TIMEOUT_S (600), GOALTENDER_TOOL_OUTPUT_CHARS
(16000), GOALTENDER_COMPACT_AT (0.75), GOALTENDER_COMMAND_POLICY (inline JSON or a .json/.toml
file; see policy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pydantic import ValidationError

from goaltender.agents import briefing
from goaltender.agents.bootstrap import Agent, Goal, run_agent
from goaltender.agents.output import one_line, redact, secret_values, truncate_middle
from goaltender.agents.policy import CommandPolicy
from goaltender.agents.recap import (
    Message,
    estimate_tokens,
    recap_lines,
    recap_text,
    split_history,
    turn_groups,
)
from goaltender.agents.runner_tools import Handler, RunnerTools, ask_person, steer_text
from goaltender.agents.settings import ConfigError, OpenAIAgentSettings
from goaltender.agents.tool_specs import TOOLS, Finish, tool_specs
from goaltender.agents.workspace_tools import WorkspaceTools
from goaltender.runner import protocol as p
from goaltender.runner.client import RunnerClient, RunnerUnavailable
from goaltender.storage.records import MetricPoint

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionMessageParam
    from openai.types.completion_usage import CompletionUsage

log = logging.getLogger(__name__)

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
OUTPUT_LIMIT_HIT = "Your reply hit the output limit; go on, more briefly."
EMPTY_REPLY = "You replied with nothing. Go on with the next step, or call finish."


class EndpointFailure(Exception):
    """The model endpoint cannot serve us: the goal fails with this message."""

    def __init__(self, title: str, detail: str = ""):
        super().__init__(f"{title} ({detail})" if detail else title)
        self.title = title
        self.detail = detail


class OpenAIAgent(Agent):
    failures = (EndpointFailure,)

    def __init__(
        self, runner: RunnerClient, goal: Goal, settings: OpenAIAgentSettings, policy: CommandPolicy
    ):
        import openai  # slow to import: after the signal handlers and the runner connection

        self.runner = runner
        self.goal_id = goal.id
        self.settings = settings
        self.resumed = goal.resumed
        self.client = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=settings.api_key,
            max_retries=settings.openai_max_retries,
            timeout=openai.Timeout(settings.openai_timeout_s, connect=min(10.0, settings.openai_timeout_s)),
        )
        self.secrets = secret_values(os.environ)
        self.tools = WorkspaceTools(
            goal.workspace,
            policy,
            functools.partial(ask_person, runner, goal.id),
            shell_timeout_s=settings.shell_timeout_s,
            output_limit=settings.output_limit,
        )
        self.verbs = RunnerTools(runner, goal.id, self.secrets, self.tools.gate_command)
        self.handlers: dict[str, Handler] = {
            **self.tools.handlers(),
            **self.verbs.handlers(),
            "finish": self.finish,
        }
        self.specs = tool_specs()
        self.messages: list[Message] = []
        self.turn = 0
        self.input_total = 0
        self.output_total = 0
        self.measured: tuple[int, int] | None = None  # (messages counted, tokens) from the last usage
        # What a request costs beyond its messages (the tool schemas, the chat template), measured
        # as the last usage minus our estimate of the messages sent; the schemas' estimate at first.
        self.overhead = estimate_tokens(self.specs)
        self.compactions = 0
        self.unseen_steers: list[str] = []  # unread at a restart: shown at the first turn boundary
        self.recap_lines: list[str] = []
        self.recap_message: Message | None = None
        self.final_text = ""
        self.finished = False
        self.last_step = ""

    # ---- the campaign ----

    async def run(self) -> int:
        summary = await self._summary()
        handoff = await self._handoff()
        briefing.prepare_workspace(self.tools.workspace, briefing.goal_brief(summary, handoff))
        if self.resumed:
            await self._recall_inbox()
        self.messages = [
            {"role": "system", "content": self._system_text(summary, handoff)},
            {"role": "user", "content": (RESUME if self.resumed else START).format(goal_id=self.goal_id)},
        ]
        if self.resumed:
            await self.verbs.post_milestone(
                "Resumed after a restart",
                "The brief was rebuilt from the runner's ledger"
                + (" and the diary's latest handoff" if handoff else " (no diary handoff found)")
                + f"; {len(summary.ledger)} experiments so far.",
            )
        log.info(
            "goal #%s: model %s at %s, window %s",
            self.goal_id,
            self.settings.model,
            self.settings.endpoint,
            self.settings.context_tokens,
        )
        ending = await self._converse()
        log.info("done after %s turns: %s", self.turn, ending)
        await self.verbs.hand_in(self._report(ending))
        return 0

    async def _converse(self) -> str:
        """Model turns until the model is done or the turn cap; returns why it ended."""
        nudged = False
        while self.turn < self.settings.max_turns:
            await self._inject_inbox()
            if self.context_tokens() > self.settings.compact_at * self.settings.context_tokens:
                await self.compact()
            response = await self._complete()
            self.turn += 1
            choice = response.choices[0]
            calls = self._record(choice.message)
            await self._account(response.usage)
            if choice.message.content:
                self.final_text = choice.message.content
            if not calls:
                if choice.finish_reason == "length":
                    self.messages.append({"role": "user", "content": OUTPUT_LIMIT_HIT})
                    continue
                if not (choice.message.content or "").strip() and not nudged:
                    nudged = True
                    self.messages.append({"role": "user", "content": EMPTY_REPLY})
                    continue
                return "the model gave its final answer"
            for call_id, name, arguments in calls:
                result = await self._execute(name, arguments)
                self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            if self.finished:
                return "the model called finish"
        cap = f"**Stopped after {self.turn} model turns** (the GOALTENDER_MAX_TURNS cap)."
        self.final_text = f"{cap}\n\n{self.final_text}" if self.final_text else cap
        return f"the turn cap ({self.settings.max_turns}) was reached"

    def _record(self, message: ChatCompletionMessage) -> list[tuple[str, str, str]]:
        """Append the model's reply to the conversation; its function calls as (id, name, arguments)."""
        named = []
        for i, call in enumerate(message.tool_calls or []):
            if (function := getattr(call, "function", None)) is None:
                continue  # a custom tool's call: there are none of ours
            call_id = call.id or f"call_{self.turn}_{i}"  # some servers omit the ids
            named.append((call_id, function.name, function.arguments or "{}"))
        assistant: Message = {"role": "assistant", "content": message.content or ("" if not named else None)}
        if named:
            assistant["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                for call_id, name, arguments in named
            ]
        self.messages.append(assistant)
        return named

    def _report(self, ending: str) -> str:
        parts = [t.strip() for t in (self.verbs.report_text, self.final_text) if t and t.strip()]
        if len(parts) == 2 and parts[1] in parts[0]:
            parts = parts[:1]
        return "\n\n".join(parts) or f"The agent ended without a summary ({ending})."

    async def stop(self) -> None:
        lines = [f"**Stopped** by the runner after {self.turn} model turns."]
        if self.last_step:
            lines.append(f"**Last step:** {self.last_step}")
        if self.verbs.report_text:
            lines.append(self.verbs.report_text.strip())
        elif self.final_text:
            lines.append(f"**Last note from the model:** {one_line(self.final_text, 1500)}")
        await self.verbs.hand_in("\n\n".join(lines))

    async def fail(self, reason: Exception) -> None:
        title = reason.title if isinstance(reason, EndpointFailure) else str(reason)
        detail = reason.detail if isinstance(reason, EndpointFailure) else ""
        await self.verbs.post_milestone(
            title, f"{title}\n{detail}\nThe goal fails: the agent cannot work without its model."
        )
        await self.verbs.hand_in(f"**The agent failed:** {title}.\n\n{self._report('the endpoint failed')}")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.close(), 2)
        await self.tools.close()

    # ---- the model ----

    async def _complete(self) -> ChatCompletion:
        import openai

        retried_context = False
        while True:
            try:
                response = await self.client.chat.completions.create(
                    model=self.settings.model,
                    # Our messages are the plain dicts these TypedDicts describe.
                    messages=cast("list[ChatCompletionMessageParam]", self.messages),
                    tools=self.specs,
                    tool_choice="auto",
                )
            except openai.BadRequestError as exc:
                text = str(exc).lower()
                if not retried_context and any(
                    w in text for w in ("context", "too long", "maximum", "token")
                ):
                    log.info("the endpoint refused the request as too long; compacting (%s)", exc)
                    retried_context = True
                    await self.compact(force=True)
                    continue
                raise EndpointFailure(
                    f"Model endpoint refused the request: {self.settings.endpoint}: {exc}"
                ) from exc
            except openai.APIConnectionError as exc:  # also APITimeoutError
                raise EndpointFailure(
                    f"Model endpoint unreachable: {self.settings.endpoint}: {_error_text(exc)}",
                    f"after {self.settings.openai_max_retries} retries; the model was {self.settings.model}",
                ) from exc
            except openai.APIStatusError as exc:
                busy = exc.status_code == 429 or exc.status_code >= 500
                what = "unreachable" if busy else "refused the request"
                raise EndpointFailure(
                    f"Model endpoint {what}: {self.settings.endpoint}: {_error_text(exc)}",
                    f"HTTP {exc.status_code} after {self.settings.openai_max_retries} retries; "
                    f"model {self.settings.model}",
                ) from exc
            if not getattr(response, "choices", None):
                raise EndpointFailure(
                    f"Model endpoint returned no answer: {self.settings.endpoint}: a reply without choices",
                    f"model {self.settings.model}: {one_line(response, 300)}",
                )
            return response

    async def _account(self, usage: CompletionUsage | None) -> None:
        if usage is not None and getattr(usage, "prompt_tokens", None) is not None:
            prompt, completion = usage.prompt_tokens, usage.completion_tokens or 0
            self.overhead = prompt - estimate_tokens(self.messages[:-1])
        else:
            prompt, completion = estimate_tokens(self.messages[:-1]), estimate_tokens(self.messages[-1])
        self.measured = (len(self.messages), prompt + completion)
        self.input_total += prompt
        self.output_total += completion
        await self._log_metrics(
            ("agent/input_tokens", self.input_total),
            ("agent/output_tokens", self.output_total),
            ("agent/context_tokens", prompt + completion),
        )

    async def _log_metrics(self, *points: tuple[str, float]) -> None:
        try:
            await self.runner.call(
                p.LogMetrics,
                p.Done,
                goal_id=self.goal_id,
                points=[MetricPoint(name=name, value=value, step=self.turn) for name, value in points],
            )
        except p.ProtocolError as exc:
            log.info("could not log %s: %s", ", ".join(name for name, _ in points), exc)

    def context_tokens(self) -> int:
        """Tokens the next request will carry: the last measured usage plus estimates of what came
        after it; before any reply (or after a compaction), an estimate of everything."""
        if self.measured is not None and self.measured[0] <= len(self.messages):
            count, tokens = self.measured
            return tokens + (estimate_tokens(self.messages[count:]) if count < len(self.messages) else 0)
        return estimate_tokens(self.messages) + self.overhead

    # ---- steering ----

    async def _recall_inbox(self) -> None:
        """After a restart: messages already read go into the brief, unread ones come as messages."""
        inbox = await self.runner.call(p.ReadInbox, p.InboxReply, goal_id=self.goal_id, all=True)
        for message in inbox.messages:
            if message.read_at is None:
                self.unseen_steers.append(steer_text(message))
            else:
                self.verbs.steers.append(steer_text(message))

    async def _inject_inbox(self) -> None:
        texts, self.unseen_steers = self.unseen_steers, []
        self.verbs.steers += texts
        try:
            texts += await self.verbs.new_messages()
        except p.ProtocolError as exc:
            log.info("could not read the inbox: %s", exc)
        for text in texts:
            self.messages.append({"role": "user", "content": text})
            log.info("steer: %s", one_line(text, 200))

    # ---- context management ----

    def _system_text(self, summary: p.SummaryReply, handoff: str | None) -> str:
        parts = [PREAMBLE, briefing.goal_brief(summary, handoff)]
        if self.tools.loaded_skills:
            parts.append(
                "## Skills you loaded\n\n"
                + "\n".join(f"- `{name}`" for name in dict.fromkeys(self.tools.loaded_skills))
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
        window = self.settings.context_tokens
        history = [m for m in self.messages[1:] if m is not self.recap_message]
        old, keep = split_history(turn_groups(history), window // (8 if force else 4))
        self.recap_lines += [line for group in old for line in recap_lines(group)]
        self.compactions += 1
        ledger = summary.text if summary.ledger else None
        self.recap_message = {
            "role": "user",
            "content": recap_text(
                self.recap_lines, ledger=ledger, turn=self.turn, compaction=self.compactions, window=window
            ),
        }
        system = {"role": "system", "content": self._system_text(summary, handoff)}
        self.messages = [system, self.recap_message, *(m for group in keep for m in group)]
        self.measured = None
        log.info(
            "compacted the context: ~%s -> ~%s tokens (window %s), %s turns recapped",
            before,
            self.context_tokens(),
            window,
            len(old),
        )
        await self._log_metrics(("agent/compactions", self.compactions))

    # ---- tools ----

    async def _execute(self, name: str, raw_arguments: str) -> str:
        handler = self.handlers.get(name)
        if handler is None:
            return f"error: there is no tool {name!r}; the tools are: {', '.join(self.handlers)}"
        try:
            arguments = json.loads(raw_arguments)
            if not isinstance(arguments, dict):
                raise ValueError("the arguments must be a JSON object")
        except ValueError as exc:
            return f"error: the arguments of {name} are not valid JSON ({exc}); send a JSON object"
        self.last_step = f"{name}({one_line(raw_arguments, 200)})"
        log.info("turn %s: %s", self.turn, self.last_step)
        try:
            result = await handler(TOOLS[name].model_validate(arguments))
        except ValidationError as exc:
            result = f"error: bad arguments for {name}: {_argument_errors(exc)}"
        except p.ProtocolError as exc:
            result = f"error: the runner refused {name}: {exc.error.code}: {exc.error.message}"
            if exc.error.code in ("budget_exhausted", "conflict"):
                result += "\nThe campaign cannot go on: submit your report and call finish."
        except RunnerUnavailable:
            raise
        except Exception as exc:  # a tool failure is the model's business, never the loop's
            result = f"error: {name} failed: {type(exc).__name__}: {exc}"
        return truncate_middle(redact(str(result), self.secrets), self.settings.output_limit)

    async def finish(self, args: Finish) -> str:
        self.finished = True
        self.final_text = args.summary
        return "finishing: the report is being handed in"


def _argument_errors(exc: ValidationError) -> str:
    """'timeout_s: Input should be a valid number; extra: Extra inputs are not permitted'."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors(include_url=False)
    )


def _error_text(exc: BaseException) -> str:
    """The exception and its causes, e.g. 'Connection error. (ConnectError: [Errno 111] ...)'."""
    text = str(exc) or type(exc).__name__
    cause, seen = exc.__cause__ or exc.__context__, 0
    while cause is not None and seen < 4:
        if str(cause) and str(cause) not in text:
            text += f" ({type(cause).__name__}: {cause})"
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return one_line(text, 500)


def start(runner: RunnerClient, goal: Goal) -> OpenAIAgent:
    """The agent for the goal, configured from the environment (ConfigError if it cannot be)."""
    settings = OpenAIAgentSettings.from_env()
    home = Path(os.environ["GOALTENDER_HOME"]) if os.environ.get("GOALTENDER_HOME") else None
    try:
        policy = CommandPolicy.load(os.environ.get("GOALTENDER_COMMAND_POLICY"), home)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{type(exc).__name__}: {exc}") from exc
    return OpenAIAgent(runner, goal, settings, policy)


def main() -> None:
    run_agent("openai", "built-in agent", start)


if __name__ == "__main__":
    main()
