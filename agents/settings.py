"""The agents' configuration, read from the environment the runner gives them (pydantic-settings).

An empty variable counts as unset. A bad value is a ConfigError naming the variable and what is
wrong with it (`GOALTENDER_MAX_TURNS='many' is not a int`); the bootstrap reports it to the goal.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Self

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO = Path(__file__).resolve().parents[1]


class ConfigError(ValueError):
    """The environment configures the agent wrongly: the message says which variable and why."""


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GOALTENDER_", env_ignore_empty=True, str_strip_whitespace=True, extra="ignore"
    )

    @classmethod
    def from_env(cls) -> Self:
        try:
            return cls()
        except ValidationError as exc:
            raise ConfigError("; ".join(_explain(cls, error) for error in exc.errors())) from None


def _explain(settings: type[BaseSettings], error: Any) -> str:
    """One validation error, told in terms of the environment variable."""
    key = str(error["loc"][0])
    field = settings.model_fields.get(key)
    name = _variable(settings, key)
    if error["type"] in ("missing", "string_too_short"):
        hint = field.description if field is not None else None
        return f"{name} is not set" + (f": {hint}" if hint else "")
    raw = error["input"]
    if error["type"].endswith("_parsing"):
        return f"{name}={raw!r} is not a {error['type'].removesuffix('_parsing')}"
    if error["type"] == "greater_than_equal":
        return f"{name}={raw!r} must be at least {error['ctx']['ge']}"
    return f"{name}={raw!r}: {error['msg']}"


def _variable(settings: type[BaseSettings], key: str) -> str:
    """The environment variable behind a field (`key` is its name, or the alias it was read by)."""
    field = settings.model_fields.get(key)
    if field is None:
        return key
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    if isinstance(alias, str):
        return alias
    return settings.model_config.get("env_prefix", "") + key.upper()


class OpenAIAgentSettings(AgentSettings):
    """The built-in agent (openai_agent.py)."""

    model: str = Field(
        min_length=1,
        description="name the model the endpoint serves (and set OPENAI_BASE_URL / OPENAI_API_KEY for "
        "the endpoint: vLLM, NIM, OpenAI, ...)",
    )
    base_url: str | None = Field(
        None, validation_alias=AliasChoices("GOALTENDER_OPENAI_BASE_URL", "OPENAI_BASE_URL")
    )
    api_key: str = Field(
        "EMPTY", validation_alias=AliasChoices("GOALTENDER_OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    context_tokens: int = Field(128_000, ge=256)
    max_turns: int = Field(200, ge=1)
    openai_max_retries: int = Field(3, ge=0)
    openai_timeout_s: float = Field(300.0, ge=0.1)
    shell_timeout_s: float = Field(600.0, ge=0.1)
    tool_output_chars: int = Field(16_000, ge=200)
    compact_at: float = Field(0.75, ge=0.1)  # compact when the context passes this share of the window

    @property
    def endpoint(self) -> str:
        return self.base_url or "https://api.openai.com/v1"

    @property
    def output_limit(self) -> int:
        """Bytes of one tool result: the configured cap, and never more than ~10% of the window."""
        return max(200, min(self.tool_output_chars, self.context_tokens * 4 // 10))


class CodexSettings(AgentSettings):
    """The Codex agent (codex_agent.py)."""

    model_config = SettingsConfigDict(env_prefix="GOALTENDER_CODEX_")

    bin: str | None = None  # the Codex CLI; see `binary`
    model: str | None = Field(None, validation_alias="GOALTENDER_MODEL")
    base_url: str | None = Field(None, validation_alias="OPENAI_BASE_URL")  # a Responses API endpoint
    context_tokens: int | None = Field(None, validation_alias="GOALTENDER_CONTEXT_TOKENS")
    sandbox: str = "workspace-write"
    approval: str = "untrusted"
    network: bool = True  # commands may use the network (and the runner's socket)
    max_turns: int = Field(20, ge=1)
    approval_timeout_s: float | None = None  # None: the runner's default
    idle_timeout_s: float = 3600.0
    retries: int | None = None  # None: Codex's default

    @property
    def binary(self) -> str:
        """GOALTENDER_CODEX_BIN, else `codex` on PATH, else the copy `make test` installs in the repo."""
        return (
            self.bin or shutil.which("codex") or str(REPO / ".codex-cli" / "node_modules" / ".bin" / "codex")
        )
