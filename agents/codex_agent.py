"""The Codex agent: a goal pursued by the Codex CLI, driven over `codex app-server` (stdio JSON-RPC).

The runner starts `python -m goaltender.agents.codex_agent` in the goal's workspace. It writes the
brief (AGENTS.md) and the skills (.agents/skills), gives Codex a per-goal CODEX_HOME in
`<workspace>/.codex` (config, rules, sessions; the sandbox keeps `.codex` read-only for Codex's own
commands), starts `codex app-server`, opens a thread in the workspace — or resumes the one named in
`.codex-thread` after a runner restart — and runs turns until Codex says the goal is done:

- each turn's last agent message -> a short milestone; everything Codex says and runs -> codex.log;
  token usage -> metrics `agent/input_tokens`, `agent/output_tokens`;
- steering from the inbox -> `turn/steer` into the running turn (or the next turn's input);
- Codex's approval requests (commands, file changes, permissions) -> runner `ask` prompts; approved
  is `accept`, rejected or expired is `decline` (a rejection's comment is passed on to Codex);
- SIGTERM (stop) -> `turn/interrupt`, a short report, the app-server ended, exit 0;
- the app-server dying, a failed turn or a silent Codex -> a milestone with the reason, exit 1.

Its configuration (environment variables, CODEX_HOME) is in codex_config.py; how it starts and
stops, in bootstrap.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import re
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from goaltender.agents.bootstrap import AgentFailure, Goal, GoalAgent, agent_log, read_settings, run_agent
from goaltender.agents.briefing import goal_brief, prepare_workspace
from goaltender.agents.codex_config import CodexSettings, codex_environment, write_codex_home
from goaltender.agents.codex_prompts import (
    CONTINUE_PROMPT,
    clip,
    command_question,
    file_question,
    first_line,
    first_prompt,
    permissions_question,
    report_text,
    resume_prompt,
    says_done,
    turn_failure,
)
from goaltender.agents.codex_rpc import METHOD_NOT_FOUND, AppServer, AppServerGone, RpcError
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerUnavailable

log = agent_log("codex")

THREAD_FILE = ".codex-thread"  # the Codex thread id, for thread/resume after a restart
PID_FILE = ".codex-app-server.pid"
LOG_FILE = "codex.log"  # everything Codex said and ran, for humans
CODEX_HOME_DIR = ".codex"
_DIARY_THREAD = re.compile(r"codex thread: (\S+)")

# Streaming noise the agent has no use for.
OPT_OUT = [
    "item/agentMessage/delta",
    "item/commandExecution/outputDelta",
    "item/fileChange/outputDelta",
    "item/reasoning/summaryTextDelta",
    "item/reasoning/summaryPartAdded",
    "item/reasoning/textDelta",
    "item/plan/delta",
    "account/rateLimits/updated",
    "remoteControl/status/changed",
]

RPC_TIMEOUT_S = 60.0
INBOX_POLL_S = 1.0


def _version() -> str:
    try:
        return importlib.metadata.version("goaltender")
    except importlib.metadata.PackageNotFoundError:
        return "0"


@dataclass
class TurnResult:
    status: str  # completed | interrupted | failed
    error: str = ""
    last_message: str = ""


# ---- the agent ----


class CodexAgent(GoalAgent):
    stop_within_s = 0.6  # the report goes first; the interrupt gets what is left

    def __init__(self, goal: Goal, settings: CodexSettings):
        super().__init__(goal)
        self.settings = settings
        self.home = self.workspace / CODEX_HOME_DIR
        self.server: AppServer | None = None
        self.thread_id: str | None = None
        self.turn_id: str | None = None  # the running turn, None between turns
        self.turns = 0
        self.last_message = ""
        self.turn_messages: list[str] = []
        self.turn_error = ""
        self.outbox: list[str] = []  # for Codex: steering and rejection comments
        self.items: dict[str, dict] = {}  # item id -> its latest state (for approval questions)
        self.approvals_waiting = 0
        self.last_heard = time.monotonic()
        self.usage_step = 0
        self.window_noted = False
        self.stopped = False
        self._log = (self.workspace / LOG_FILE).open("a", encoding="utf-8")

    # ---- logging ----

    def note(self, line: str, verbose: str = "") -> None:
        """One line to agent.log (stderr) and codex.log; `verbose` to codex.log only."""
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        log.info("%s", line)
        self._log.write(f"{stamp} {line}\n")
        if verbose:
            self._log.write("".join(f"    {v}\n" for v in verbose.rstrip().splitlines()))
        self._log.flush()

    async def milestone(self, title: str, text: str = "") -> str:
        with contextlib.suppress(p.ProtocolError, RunnerUnavailable):
            return await super().milestone(title, clip(text, 19_000))
        return ""

    async def submit_report(self, text: str) -> None:
        with contextlib.suppress(p.ProtocolError, RunnerUnavailable):
            await super().submit_report(clip(text, 49_000))

    # ---- the campaign ----

    async def run(self) -> None:
        try:
            await self._campaign()
        except (AppServerGone, TimeoutError, RpcError) as exc:
            raise AgentFailure(str(exc)) from exc

    async def _campaign(self) -> None:
        summary = await self.runner.request(p.Summary(goal_id=self.goal_id))
        handoffs = await self.runner.request(p.ReadDiary(goal_id=self.goal_id, last=1, kind="handoff"))
        handoff = handoffs.entries[-1].text if handoffs.entries else None
        brief = goal_brief(summary, handoff)
        prepare_workspace(self.workspace, brief)
        series = await self.runner.request(p.GetSeries(goal_id=self.goal_id, name="agent/input_tokens"))
        self.usage_step = int(max((s for s, _ in series.points if s is not None), default=0))

        await self.start_server()
        prompt = first_prompt()
        previous = await self.previous_thread() if self.goal.resumed else None
        if previous and await self.resume_thread(previous):
            prompt = resume_prompt(brief)
        if self.thread_id is None:
            await self.start_thread()

        while True:
            result = await self.run_turn(prompt)
            if result.status == "failed":
                raise AgentFailure(turn_failure(result.error))
            await self.read_inbox()
            if result.status == "completed" and says_done(result.last_message) and not self.outbox:
                await self.submit_report(
                    report_text(result.last_message) or "Codex finished without a report."
                )
                self.note(f"done after {self.turns} turn(s)")
                return
            if self.turns >= self.settings.max_turns:
                why = f"Codex used its {self.settings.max_turns} turns without saying the goal is complete."
                await self.submit_report(
                    f"{why}\n\nCodex's last message:\n\n{report_text(self.last_message)}"
                )
                await self.milestone("Codex turn limit reached", why)
                self.note(why)
                return
            prompt = "\n\n".join(self.outbox) if self.outbox else CONTINUE_PROMPT
            self.outbox.clear()

    async def start_server(self) -> None:
        write_codex_home(self.home, self.settings)
        binary = self.settings.binary
        if not (Path(binary).is_file() or shutil.which(binary)):
            raise AgentFailure(
                f"no Codex CLI at {binary!r}: install it (`npm install -g @openai/codex`) or set GOALTENDER_CODEX_BIN"
            )
        self.server = AppServer(
            [binary, "app-server"],
            env=codex_environment(self.home, self.settings),
            cwd=self.workspace,
            stderr_path=self.home / "app-server.log",
            on_request=self.on_request,
            on_notification=self.observe,
        )
        await self.server.start()
        (self.workspace / PID_FILE).write_text(f"{self.server.pid}\n")
        self.note(f"started {binary} app-server (pid {self.server.pid}, CODEX_HOME={self.home})")
        info = await self.server.request(
            "initialize",
            {
                "clientInfo": {"name": "goaltender", "title": "Goaltender", "version": _version()},
                "capabilities": {"optOutNotificationMethods": OPT_OUT},
            },
            wait_s=RPC_TIMEOUT_S,
        )
        await self.server.notify("initialized")
        self.note(f"initialized: {info.get('userAgent', '?')}")

    def thread_params(self) -> dict:
        params: dict[str, Any] = {
            "cwd": str(self.workspace),
            "approvalPolicy": self.settings.approval,
            "sandbox": self.settings.sandbox,
        }
        if self.settings.model:
            params["model"] = self.settings.model
        return params

    async def start_thread(self) -> None:
        assert self.server is not None
        result = await self.server.request("thread/start", self.thread_params(), wait_s=RPC_TIMEOUT_S)
        self.thread_id = result["thread"]["id"]
        (self.workspace / THREAD_FILE).write_text(self.thread_id + "\n")
        model = result.get("model") or result["thread"].get("model") or self.settings.model or "default"
        await self.runner.request(
            p.WriteDiary(
                goal_id=self.goal_id,
                kind="note",
                text=f"codex thread: {self.thread_id}\nInspect or continue it by hand: "
                f"CODEX_HOME={self.home} codex resume {self.thread_id}",
            )
        )
        self.note(f"thread {self.thread_id} started in {self.workspace} (model {model})")
        await self.milestone(
            "Codex started",
            f"Thread {self.thread_id}, model {model}, sandbox {self.settings.sandbox}, approvals "
            f"{self.settings.approval}. Its log: {self.workspace / LOG_FILE}",
        )

    async def previous_thread(self) -> str | None:
        path = self.workspace / THREAD_FILE
        if path.is_file() and (text := path.read_text().strip()):
            return text
        notes = await self.runner.request(p.ReadDiary(goal_id=self.goal_id, last=50, kind="note"))
        for entry in reversed(notes.entries):
            if m := _DIARY_THREAD.search(entry.text):
                return m.group(1)
        return None

    async def resume_thread(self, thread_id: str) -> bool:
        assert self.server is not None
        try:
            await self.server.request(
                "thread/resume",
                {"threadId": thread_id, "excludeTurns": True, **self.thread_params()},
                wait_s=RPC_TIMEOUT_S,
            )
        except RpcError as exc:
            self.note(f"could not resume thread {thread_id}: {exc.message}; starting a new one")
            await self.milestone(
                "Codex could not resume its thread", f"{thread_id}: {exc.message}. Starting a new thread."
            )
            return False
        self.thread_id = thread_id
        (self.workspace / THREAD_FILE).write_text(thread_id + "\n")
        self.note(f"resumed thread {thread_id}")
        await self.milestone("Codex resumed its thread after a restart", f"Thread {thread_id}.")
        return True

    async def run_turn(self, text: str) -> TurnResult:
        """Start a turn and follow it to turn/completed, steering from the inbox as it runs."""
        assert self.server is not None and self.thread_id is not None
        self.turn_messages, self.turn_error = [], ""
        result = await self.server.request(
            "turn/start",
            {"threadId": self.thread_id, "input": [{"type": "text", "text": text}]},
            wait_s=RPC_TIMEOUT_S,
        )
        self.turn_id = result["turn"]["id"]
        self.turns += 1
        self.note(f"turn {self.turns} started ({self.turn_id})", clip(text, 4000))
        self.last_heard = last_poll = time.monotonic()
        try:
            while True:
                try:
                    message = await self.server.next_notification(wait_s=INBOX_POLL_S / 2)
                except AppServerGone as exc:
                    raise AgentFailure(f"{exc} in the middle of turn {self.turns}") from exc
                if message is not None:
                    self.last_heard = time.monotonic()
                    if (done := await self.handle(*message)) is not None:
                        self.turn_id = None
                        return done
                if time.monotonic() - last_poll >= INBOX_POLL_S:
                    last_poll = time.monotonic()
                    await self.read_inbox()
                    await self.steer()
                silent = time.monotonic() - self.last_heard
                if self.approvals_waiting == 0 and silent > self.settings.idle_timeout_s:
                    with contextlib.suppress(Exception):
                        await self.server.interrupt(self.thread_id, self.turn_id, wait_s=5)
                    raise AgentFailure(f"no word from Codex for {silent:.0f}s in turn {self.turns}")
        except asyncio.CancelledError:
            raise  # stopped: stop() interrupts the turn, so it keeps its id
        except BaseException:
            self.turn_id = None
            raise

    async def handle(self, method: str, params: dict) -> TurnResult | None:
        """Map one notification; returns the turn's result when it is over."""
        if method == "item/completed":
            self.on_item_completed(params.get("item") or {})
        elif method == "item/started":
            item = params.get("item") or {}
            if item.get("type") == "commandExecution":
                self.note(f"$ {item.get('command', '')}")
        elif method == "thread/tokenUsage/updated":
            await self.log_usage(params.get("tokenUsage") or {})
        elif method == "error":
            error = (params.get("error") or {}).get("message", "")
            retry = params.get("willRetry")
            self.note(f"Codex error{' (retrying)' if retry else ''}: {error}")
            if not retry:
                self.turn_error = error
        elif method in ("warning", "configWarning", "deprecationNotice", "guardianWarning"):
            self.note(f"Codex {method}: {params.get('message') or params.get('summary') or params}")
        elif method == "turn/completed" and params.get("threadId") in (self.thread_id, None):
            turn = params.get("turn") or {}
            if turn.get("id") not in (self.turn_id, None):
                return None
            status = turn.get("status", "completed")
            error = (turn.get("error") or {}).get("message") or self.turn_error
            last = self.turn_messages[-1] if self.turn_messages else ""
            self.note(f"turn {self.turns} {status}" + (f": {error}" if error else ""))
            if last and status == "completed":
                await self.milestone(f"Codex: {first_line(last)}", clip(last, 3000))
            return TurnResult(status=status, error=error, last_message=last)
        return None

    def observe(self, method: str, params: dict) -> None:
        """Called in arrival order by the reader: keep items, so approval prompts can show them."""
        item = params.get("item") if method in ("item/started", "item/completed") else None
        if item and item.get("type") in ("commandExecution", "fileChange") and item.get("id"):
            self.items[item["id"]] = item
            if len(self.items) > 200:
                self.items.pop(next(iter(self.items)))

    def on_item_completed(self, item: dict) -> None:
        kind = item.get("type")
        if kind == "agentMessage" and (text := item.get("text", "")):
            self.turn_messages.append(text)
            self.last_message = text
            self.note(f"Codex says: {first_line(text, 120)}", text)
        elif kind == "commandExecution":
            output = item.get("aggregatedOutput") or ""
            self.note(
                f"command {item.get('status')} (exit {item.get('exitCode')}, {item.get('durationMs')} ms): "
                f"{item.get('command', '')}",
                clip(output, 4000),
            )
        elif kind == "fileChange":
            paths = ", ".join(c.get("path", "?") for c in item.get("changes") or [])
            self.note(f"file change {item.get('status')}: {paths}")
        elif kind in ("mcpToolCall", "webSearch", "dynamicToolCall"):
            self.note(f"{kind} {item.get('status', '')}: {item.get('tool') or item.get('query') or ''}")

    async def log_usage(self, usage: dict) -> None:
        total = usage.get("total") or {}
        if "inputTokens" not in total:
            return
        self.usage_step += 1
        if not self.window_noted:
            self.window_noted = True
            self.note(f"model context window: {usage.get('modelContextWindow')} tokens")
        points = [
            {"name": "agent/input_tokens", "value": total["inputTokens"], "step": self.usage_step},
            {"name": "agent/output_tokens", "value": total.get("outputTokens", 0), "step": self.usage_step},
        ]
        with contextlib.suppress(p.ProtocolError, RunnerUnavailable):
            await self.runner.request(p.LogMetrics(goal_id=self.goal_id, points=points))

    # ---- steering ----

    async def read_inbox(self) -> None:
        inbox = await self.runner.request(p.ReadInbox(goal_id=self.goal_id))
        for message in inbox.messages:
            self.note(f"steer from {message.author}: {message.text}")
            self.outbox.append(
                f"Steering from {message.author} (a person watching this goal): {message.text}"
            )

    async def steer(self) -> None:
        """Pass the outbox into the running turn; what cannot be steered waits for the next turn."""
        if not self.outbox or self.turn_id is None or self.server is None:
            return
        text = "\n\n".join(self.outbox)
        try:
            await self.server.request(
                "turn/steer",
                {
                    "threadId": self.thread_id,
                    "expectedTurnId": self.turn_id,
                    "input": [{"type": "text", "text": text}],
                },
                wait_s=RPC_TIMEOUT_S,
            )
        except RpcError as exc:
            self.note(f"turn/steer refused ({exc.message}); the message goes into the next turn")
            return
        self.outbox.clear()
        self.note(f"steered turn {self.turns} (turn/steer)", text)
        await self.milestone("Steering passed to Codex", clip(text, 2000))

    # ---- approvals: Codex asks, people decide ----

    async def on_request(self, method: str, params: dict, request_id: Any) -> Any:
        if method == "item/commandExecution/requestApproval":
            approved = await self.ask("command", *command_question(params, self.workspace))
            return {"decision": "accept" if approved else "decline"}
        if method == "item/fileChange/requestApproval":
            approved = await self.ask(
                "file", *file_question(params, self.items.get(params.get("itemId", ""), {}))
            )
            return {"decision": "accept" if approved else "decline"}
        if method == "item/permissions/requestApproval":
            approved = await self.ask("permissions", *permissions_question(params))
            # The grant has the request's shape; nothing granted is an empty profile.
            return {"permissions": (params.get("permissions") or {}) if approved else {}, "scope": "turn"}
        if method in ("execCommandApproval", "applyPatchApproval"):  # the v1 protocol's forms
            command = params.get("command")
            what = " ".join(command) if isinstance(command, list) else "apply a patch"
            approved = await self.ask(
                "command", f"Codex wants to run: {what}", json.dumps(params)[:4000], what
            )
            return {"decision": "approved" if approved else {"denied": {"rejection": "declined by a person"}}}
        if method == "mcpServer/elicitation/request":
            return {"action": "decline", "content": None}
        self.note(f"answered an unsupported request from Codex with an error: {method}")
        raise RpcError(METHOD_NOT_FOUND, f"goaltender's Codex agent does not handle {method}")

    async def ask(self, kind: str, question: str, detail: str, what: str) -> bool:
        """A runner approval prompt; True only when a person approved it."""
        self.approvals_waiting += 1
        self.note(f"asking people ({kind}): {question}")
        timeout = self.settings.approval_timeout_s
        try:
            reply = await asyncio.wait_for(
                self.runner.request(
                    p.Ask(
                        goal_id=self.goal_id,
                        kind=kind,
                        question=question[:3000],
                        detail=detail[:20_000],
                        timeout_s=timeout,
                    )
                ),
                (timeout or 7 * 24 * 3600) + 60,
            )
        except (p.ProtocolError, RunnerUnavailable, TimeoutError) as exc:
            self.note(f"no decision ({exc}); declining")
            return False
        finally:
            self.approvals_waiting -= 1
            self.last_heard = time.monotonic()
        approval = reply.approval
        self.note(f"approval #{approval.id} {approval.state} by {approval.decided_by or 'nobody'}")
        if approval.state != "approved" and approval.comment and approval.decided_by != "runner":
            self.outbox.append(f"{approval.decided_by} declined ({what}): {approval.comment}")
        return approval.state == "approved"

    # ---- ending ----

    async def stop(self) -> None:
        """Stopped by the runner (SIGTERM): hand in a short report, interrupt the turn. Fast: the
        runner kills the process group after its grace period (the report goes first)."""
        self.stopped = True
        running = self.turn_id
        last = report_text(self.last_message)
        await self.submit_report(
            f"Stopped during turn {self.turns} of the Codex session (thread {self.thread_id})."
            + (f"\n\nCodex's last message:\n\n{last}" if last else "")
        )
        if running and self.server is not None and not self.server.gone.is_set():
            deadline = time.monotonic() + 0.4
            try:
                await self.server.interrupt(self.thread_id, running, wait_s=0.3)
                while (left := deadline - time.monotonic()) > 0:
                    message = await self.server.next_notification(wait_s=left)
                    if message and message[0] == "turn/completed":
                        self.note(f"turn {self.turns} {(message[1].get('turn') or {}).get('status')}")
                        break
            except Exception as exc:
                self.note(f"could not interrupt turn {self.turns} cleanly: {exc}")
        self.note("stopped")

    async def fail(self, failure: AgentFailure) -> None:
        reason = failure.title
        tail = self.server.stderr_tail() if self.server else ""
        self.note(f"failing: {reason}", tail)
        await self.milestone(
            f"Codex agent failed: {first_line(reason, 200)}", reason + (f"\n\n{tail}" if tail else "")
        )
        last = report_text(self.last_message)
        await self.submit_report(
            f"The Codex agent failed: {reason}" + (f"\n\nCodex's last message:\n\n{last}" if last else "")
        )

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close(0.3 if self.stopped else 1.0)
            self.note(f"{self.server.describe_exit()}")
        self._log.close()


def build(goal: Goal) -> CodexAgent:
    return CodexAgent(goal, read_settings(CodexSettings))


def main() -> None:
    run_agent("codex", "The Codex agent", build)


if __name__ == "__main__":
    main()
