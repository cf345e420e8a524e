"""Runner configuration: `GOALTENDER_*` environment variables, or a TOML file (GOALTENDER_CONFIG)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


def _default_agents() -> dict[str, list[str]]:
    return {
        name: [sys.executable, "-m", f"goaltender.agents.{module}"]
        for name, module in (("sweep", "sweep"), ("openai", "openai_agent"), ("codex", "codex_agent"))
    }


class GoaltenderSettings(BaseSettings):
    """`GOALTENDER_*` environment variables first, then the TOML file named by GOALTENDER_CONFIG."""

    model_config = SettingsConfigDict(env_prefix="GOALTENDER_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if config := os.environ.get("GOALTENDER_CONFIG"):
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config))
        return tuple(sources)


class RunnerSettings(GoaltenderSettings):
    home: Path = Field(default_factory=lambda: Path.home() / ".goaltender")
    """State lives here: runner.db, runner.sock, workspaces/, cache/. Put it on the big disk."""
    name: str = Field(default_factory=lambda: os.uname().nodename)
    socket: Path | None = None  # default: <home>/runner.sock
    default_agent: str = "sweep"
    agents: dict[str, list[str]] = Field(default_factory=_default_agents)
    """Agent name -> command. The runner adds GOALTENDER_SOCKET / _GOAL_ID / _WORKSPACE to its env."""
    approval_timeout_s: float = 3600.0
    experiment_timeout_s: float = 3600.0
    stop_grace_s: float = 5.0
    compute_unit: Literal["auto", "gpu", "cpu"] = "auto"

    @property
    def socket_path(self) -> Path:
        return self.socket or self.home / "runner.sock"

    @property
    def db_path(self) -> Path:
        return self.home / "runner.db"

    @property
    def workspaces(self) -> Path:
        return self.home / "workspaces"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"
