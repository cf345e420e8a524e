"""The built-in agent's tools as the model sees them: one pydantic model per tool, whose docstring
is the tool's description and whose fields are its arguments. The function specs sent with every
request are generated from these models by the openai SDK, and the same models validate the
arguments the model sends back."""

from __future__ import annotations

from typing import Any, Literal

import openai
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import BaseModel, ConfigDict, Field


def _without_repeats(schema: dict[str, Any]) -> None:
    """Every request carries the schemas: drop what they repeat (the docstring, already the tool's
    description, and titles that restate the names)."""
    schema.pop("description", None)
    schema.pop("title", None)
    for field in schema.get("properties", {}).values():
        field.pop("title", None)


class ToolArguments(BaseModel):
    # An unknown argument is an error the model can fix.
    model_config = ConfigDict(extra="forbid", json_schema_extra=_without_repeats)


class Shell(ToolArguments):
    """Run a bash command in the workspace and return its exit code and output (head and tail kept
    when long). Risky commands (sudo, installs, network, deleting or writing outside the workspace,
    killing processes you did not start) wait for a person's approval first. Use run_experiment,
    not shell, for experiments."""

    command: str
    timeout_s: float | None = Field(None, description="seconds before it is killed")


class ReadFile(ToolArguments):
    """Read a text file (paths relative to the workspace)."""

    path: str
    offset: int | None = Field(None, description="first line to read, 1-based (default 1)")
    limit: int | None = Field(None, description="how many lines (default 2000)")


class WriteFile(ToolArguments):
    """Create or overwrite a file with the given content (parent directories are created)."""

    path: str
    content: str


class EditFile(ToolArguments):
    """Replace an exact string in a file; it must occur exactly once (include surrounding lines)."""

    path: str
    old_string: str
    new_string: str


class ListFiles(ToolArguments):
    """List files under a directory of the workspace, with sizes."""

    path: str | None = Field(None, description="the directory (default: the workspace)")
    depth: int | None = Field(None, description="how deep to recurse (default 2)")


class LoadSkill(ToolArguments):
    """Load a skill's instructions (SKILL.md) by name; the brief lists the skills."""

    name: str


Command = str | list[str]


class RunExperiment(ToolArguments):
    """Run one experiment under the runner's supervision: its own log, live metrics, a timeout,
    resource accounting and a ledger row (keep = new best, discard, crash). One hypothesis per run.
    Returns when the run has finished. The runner refuses runs past the budget."""

    command: Command = Field(description="the command: an argv list, or a string run with bash -c")
    description: str = Field(description="the hypothesis this run tests")
    params: dict[str, Any] | None = Field(None, description="the config values this run uses, for the ledger")
    metric: str | None = Field(None, description="headline metric name, printed by the run as `name: value`")
    direction: Literal["maximize", "minimize"] | None = None
    timeout_s: float | None = Field(None, description="per-run time limit in seconds")
    eval_command: Command | None = Field(
        None,
        description="run by the runner after a successful run to measure the metric on held-out "
        "data (it finds the run's files in $GOALTENDER_EXPERIMENT_DIR)",
    )


class Milestone(ToolArguments):
    """Post a milestone to the goal's thread (plans, new bests, findings, changes of direction)."""

    title: str
    text: str | None = None


class LogMetrics(ToolArguments):
    """Log metric points to the goal's series."""

    metrics: dict[str, float] = Field(description="metric name -> number")
    step: float | None = None
    experiment_id: int | None = None


class AskApproval(ToolArguments):
    """Ask the people for approval and wait for their decision (costly or risky steps)."""

    question: str
    detail: str | None = Field(None, description="cost, risk, plan: what they need to decide")
    kind: str | None = Field(None, description="cost | command | generic")


class ReadInbox(ToolArguments):
    """Read steering messages from people that have not been seen yet."""


class WriteDiary(ToolArguments):
    """Write to the durable diary. A handoff (handoff=true) is what a restarted or compacted
    session is given: current best, what was tried, what is next, constraints from people."""

    text: str
    handoff: bool | None = None


class ReadDiary(ToolArguments):
    """Read the latest diary entries."""

    last: int | None = Field(None, description="how many (default 5)")
    handoff_only: bool | None = None


class SubmitReport(ToolArguments):
    """Store your words for the final report (what was learnt, the best config, what to try next).
    Calling it again replaces the text."""

    text: str


class Finish(ToolArguments):
    """Declare the campaign done (stop rule met, budget used, or nothing left worth trying).
    `summary` becomes the final report's text from you. Ends the session."""

    summary: str


TOOLS: dict[str, type[ToolArguments]] = {
    "shell": Shell,
    "read_file": ReadFile,
    "write_file": WriteFile,
    "edit_file": EditFile,
    "list_files": ListFiles,
    "load_skill": LoadSkill,
    "run_experiment": RunExperiment,
    "milestone": Milestone,
    "log_metrics": LogMetrics,
    "ask_approval": AskApproval,
    "read_inbox": ReadInbox,
    "write_diary": WriteDiary,
    "read_diary": ReadDiary,
    "submit_report": SubmitReport,
    "finish": Finish,
}


def tool_specs() -> list[ChatCompletionFunctionToolParam]:
    """The Chat Completions function tools, generated from TOOLS."""
    specs = []
    for name, model in TOOLS.items():
        spec = openai.pydantic_function_tool(
            model, name=name, description=" ".join((model.__doc__ or "").split())
        )
        # Not strict: strict schemas cannot hold the free-form objects of `params` and `metrics`
        # (OpenAI refuses them), and other endpoints ignore or reject the flag.
        spec["function"]["strict"] = False
        specs.append(spec)
    return specs
