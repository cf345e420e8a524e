"""The built-in agent's function tools, declared as pydantic models of their arguments.

A model's docstring is the tool's description and its fields are the arguments; `function_tool`
turns it into a Chat Completions tool spec, and the same model validates the arguments the model
sends. Not `openai.pydantic_function_tool`: that marks the tool strict, which makes every argument
required and refuses free-form objects (`params`, `metrics`), so OpenAI itself would reject the
schema and other endpoints would demand every optional argument.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic.json_schema import SkipJsonSchema as Omitted

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionFunctionToolParam


class ToolArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ForTheModel(GenerateJsonSchema):
    """Without what only costs the model tokens: property titles ("Timeout S"), null defaults."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def default_schema(self, schema: Any) -> JsonSchemaValue:
        json_schema = super().default_schema(schema)
        if "default" in json_schema and json_schema["default"] is None:
            del json_schema["default"]
        return json_schema


A = TypeVar("A", bound=ToolArguments)


@dataclass(frozen=True)
class Tool(Generic[A]):
    """A tool the model may call: its name, its arguments, what runs it."""

    name: str
    arguments: type[A]
    run: Callable[[A], Awaitable[str]]


def function_tool(tool: Tool[Any]) -> ChatCompletionFunctionToolParam:
    """The Chat Completions spec of a tool."""
    parameters = tool.arguments.model_json_schema(schema_generator=_ForTheModel)
    parameters.pop("title", None)
    description = " ".join(parameters.pop("description", "").split())
    return {
        "type": "function",
        "function": {"name": tool.name, "description": description, "parameters": parameters},
    }


# ---- the workspace ----


class Shell(ToolArguments):
    """Run a bash command in the workspace and return its exit code and output (head and tail kept
    when long). Risky commands (sudo, installs, network, deleting or writing outside the workspace,
    killing processes you did not start) wait for a person's approval first. Use run_experiment,
    not shell, for experiments."""

    command: str
    timeout_s: float | Omitted[None] = Field(None, description="seconds before it is killed")


class ReadFile(ToolArguments):
    """Read a text file (paths relative to the workspace)."""

    path: str
    offset: int = Field(1, description="first line to read, 1-based")
    limit: int = Field(2000, description="how many lines")


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

    path: str = "."
    depth: int = Field(2, description="how deep to recurse (default 2)")


class LoadSkill(ToolArguments):
    """Load a skill's instructions (SKILL.md) by name; the brief lists the skills."""

    name: str


# ---- the runner's verbs ----

Command = str | list[str]


class RunExperiment(ToolArguments):
    """Run one experiment under the runner's supervision: its own log, live metrics, a timeout,
    resource accounting and a ledger row (keep = new best, discard, crash). One hypothesis per
    run. Returns when the run has finished. The runner refuses runs past the budget."""

    command: Command = Field(description="the command: an argv list, or a string run with bash -c")
    description: str = Field(description="the hypothesis this run tests")
    params: dict[str, Any] = Field(
        default_factory=dict, description="the config values this run uses, for the ledger"
    )
    metric: str | Omitted[None] = Field(
        None, description="headline metric name, printed by the run as `name: value`"
    )
    direction: Literal["maximize", "minimize"] | Omitted[None] = None
    timeout_s: float | Omitted[None] = Field(None, description="per-run time limit in seconds")
    eval_command: Command | Omitted[None] = Field(
        None,
        description="run by the runner after a successful run to measure the metric on held-out "
        "data (it finds the run's files in $GOALTENDER_EXPERIMENT_DIR)",
    )


class NemoRl(ToolArguments):
    """Train with NeMo RL as one supervised experiment (what `goaltender nemo-rl` does): the runner
    runs the recipe in the box's NeMo RL checkout ($NEMO_RL_DIR), logs and checkpoints in the
    experiment's directory, its TensorBoard scalars streamed into the series, and names the best
    checkpoint (step_N) by the metric: the ledger row gets its value, the thread the training
    curves. Returns when the run has finished."""

    recipe: Literal["sft", "vlm-sft", "grpo", "vlm-grpo"]
    config: str = Field(description="the NeMo RL config (YAML), relative to the workspace")
    overrides: list[str] = Field(default_factory=list, description="NeMo RL overrides, key=value")
    description: str | Omitted[None] = Field(None, description="the hypothesis this run tests")
    metric: str | Omitted[None] = Field(
        None, description="a TensorBoard tag; default validation/val_loss (SFT), validation/accuracy (GRPO)"
    )
    direction: Literal["maximize", "minimize"] | Omitted[None] = None
    timeout_s: float | Omitted[None] = Field(None, description="per-run time limit in seconds")
    eval_command: Command | Omitted[None] = Field(
        None,
        description="run by the runner after a clean run to score its best checkpoint on held-out "
        "data (it finds the checkpoints in $GOALTENDER_EXPERIMENT_DIR); the ledger's headline is "
        "then what it prints, and `metric` only picks the best checkpoint",
    )
    eval_metric: str | Omitted[None] = Field(
        None, description="the metric the eval prints, e.g. exact_accuracy (default: the goal's)"
    )


class Milestone(ToolArguments):
    """Post a milestone to the goal's thread (plans, new bests, findings, changes of direction)."""

    title: str
    text: str = ""


class LogMetrics(ToolArguments):
    """Log metric points to the goal's series."""

    metrics: dict[str, float] = Field(description="metric name -> number")
    step: float | Omitted[None] = None
    experiment_id: int | Omitted[None] = None


class AskApproval(ToolArguments):
    """Ask the people for approval and wait for their decision (costly or risky steps)."""

    question: str
    detail: str = Field("", description="cost, risk, plan: what they need to decide")
    kind: str = Field("generic", description="cost | command | generic")


class ReadInbox(ToolArguments):
    """Read steering messages from people that have not been seen yet."""


class WriteDiary(ToolArguments):
    """Write to the durable diary. A handoff (handoff=true) is what a restarted or compacted
    session is given: current best, what was tried, what is next, constraints from people."""

    text: str
    handoff: bool = False


class ReadDiary(ToolArguments):
    """Read the latest diary entries."""

    last: int = 5
    handoff_only: bool = False


class SubmitReport(ToolArguments):
    """Store your words for the final report (what was learnt, the best config, what to try
    next). Calling it again replaces the text."""

    text: str


class FetchFromHub(ToolArguments):
    """Have the runner download a model or data set from the Hugging Face hub (or the box's
    mirror) into the hub cache shared by goals (read-only to you: this is the only way in), and
    record it in the goal's ledger (what `goaltender fetch` does). Returns the local path and the
    commit the revision resolved to; a big download posts progress milestones. Gated and private
    repos use the box's HF_TOKEN when it is granted to goals."""

    repo: str = Field(description="owner/name on the hub, e.g. Qwen/Qwen3-0.6B")
    repo_type: Literal["model", "dataset"] = "model"
    revision: str | Omitted[None] = Field(None, description="a branch, tag or commit (default: main)")
    include: list[str] = Field(
        default_factory=list,
        description="globs of the files wanted, e.g. ['*.json', '*.safetensors']; default all",
    )


class Finish(ToolArguments):
    """Declare the campaign done (stop rule met, budget used, or nothing left worth trying).
    `summary` becomes the final report's text from you. Ends the session."""

    summary: str
