"""The Codex agent's configuration: its settings (environment variables), the per-goal CODEX_HOME
it gives Codex (config.toml, rules) and the environment `codex app-server` runs in.

Environment: GOALTENDER_CODEX_BIN, GOALTENDER_MODEL, OPENAI_BASE_URL and OPENAI_API_KEY (a
Responses API endpoint, e.g. vLLM), GOALTENDER_CONTEXT_TOKENS, GOALTENDER_CODEX_SANDBOX
(workspace-write), GOALTENDER_CODEX_APPROVAL (untrusted), GOALTENDER_CODEX_NETWORK (1: commands
may use the network and the runner's socket), GOALTENDER_CODEX_MAX_TURNS (20),
GOALTENDER_CODEX_APPROVAL_TIMEOUT_S (the runner's default), GOALTENDER_CODEX_IDLE_TIMEOUT_S
(3600), GOALTENDER_CODEX_RETRIES (Codex's default).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO = Path(__file__).resolve().parents[1]

# Verbs Codex may run without asking: they only report to the runner. `goaltender experiment`
# (which runs arbitrary commands outside the sandbox) still asks.
ALLOWED_VERBS = (
    "milestone",
    "metrics",
    "inbox",
    "diary",
    "report",
    "ask",
    "skills edit",  # proposes only: nothing is written before a person approves the diff
    "skill-edit",  # its old name
    "status",
    "summary",
    "log",
)


# The brief reaches Codex only as AGENTS.md, which Codex cuts past `project_doc_max_bytes` (32 KiB
# by default): room for the longest brief, a diary handoff of 50,000 characters included.
BRIEF_MAX_BYTES = 256 * 1024


def find_codex() -> str:
    """`codex` on PATH, else the copy `make test` installs in the repository."""
    return shutil.which("codex") or str(REPO / ".codex-cli" / "node_modules" / ".bin" / "codex")


class CodexSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GOALTENDER_CODEX_", extra="ignore", env_ignore_empty=True)

    binary: str = Field(default_factory=find_codex, validation_alias="GOALTENDER_CODEX_BIN")
    model: str | None = Field(None, validation_alias="GOALTENDER_MODEL")
    base_url: str | None = Field(None, validation_alias="OPENAI_BASE_URL")
    context_tokens: int | None = Field(None, ge=1, validation_alias="GOALTENDER_CONTEXT_TOKENS")
    sandbox: str = "workspace-write"
    approval: str = "untrusted"
    network: bool = True
    max_turns: int = Field(20, ge=1)
    approval_timeout_s: float | None = Field(None, gt=0)
    idle_timeout_s: float = Field(3600.0, gt=0)
    retries: int | None = Field(None, ge=0)


def write_codex_home(home: Path, settings: CodexSettings) -> None:
    """config.toml (model, provider, sandbox) and rules letting the reporting verbs run without a
    prompt. Rewritten at every start, so a changed environment takes effect."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        "# Written by goaltender's Codex agent at every start; edits are overwritten.\n"
        + tomli_w.dumps(codex_config(settings))
    )
    rules = home / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "goaltender.rules").write_text(
        "# Written by goaltender: the reporting verbs only talk to the runner.\n"
        + "".join(
            f'prefix_rule(pattern = {json.dumps(["goaltender", *verb.split()])}, decision = "allow")\n'
            for verb in ALLOWED_VERBS
        )
    )


def codex_config(settings: CodexSettings) -> dict[str, Any]:
    """What config.toml holds. The approval policy and sandbox go in thread/start instead (Codex
    0.171 refuses to start with `approval_policy = "untrusted"` in config.toml, yet accepts it as
    a thread parameter). The whole brief in AGENTS.md (BRIEF_MAX_BYTES). No login shells: a login
    profile resets PATH (Debian's /etc/profile does for root), and the agent's commands need the
    PATH the runner gave it, with the `goaltender` verbs on it."""
    config: dict[str, Any] = {"allow_login_shell": False, "project_doc_max_bytes": BRIEF_MAX_BYTES}
    if settings.model:
        config["model"] = settings.model
    if settings.context_tokens:
        config["model_context_window"] = settings.context_tokens
    config["sandbox_workspace_write"] = {"network_access": settings.network}
    if settings.base_url:
        config["model_provider"] = "goaltender"
        provider: dict[str, Any] = {
            "name": "goaltender endpoint",
            "base_url": settings.base_url,
            "wire_api": "responses",
            "env_key": "OPENAI_API_KEY",
        }
        if settings.retries is not None:
            provider |= {"request_max_retries": settings.retries, "stream_max_retries": settings.retries}
        config["model_providers"] = {"goaltender": provider}
    return config


def codex_environment(home: Path, settings: CodexSettings) -> dict[str, str]:
    env = dict(os.environ)
    env["CODEX_HOME"] = str(home)
    if settings.base_url and not env.get("OPENAI_API_KEY"):
        env["OPENAI_API_KEY"] = "unused"  # local endpoints (vLLM) take any key; Codex insists on one
    elif not settings.base_url:
        # The default provider: reuse the person's Codex login, if there is one.
        user_home = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")
        auth, link = user_home / "auth.json", home / "auth.json"
        if auth.is_file() and not link.exists() and user_home.resolve() != home.resolve():
            with contextlib.suppress(OSError):
                link.symlink_to(auth)
    return env
