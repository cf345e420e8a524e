"""Codex's per-goal home (CODEX_HOME = <workspace>/.codex) and the environment app-server runs in:
config.toml (model, provider, sandbox; written with tomli-w), the rules that let the reporting
verbs run without a prompt, and the person's Codex login when the default provider is used."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import tomli_w

from goaltender.agents.settings import CodexSettings

CODEX_HOME_DIR = ".codex"

# Verbs Codex may run without asking: they only report to the runner. `goaltender experiment`
# (which runs arbitrary commands outside the sandbox) still asks.
ALLOWED_VERBS = ("milestone", "metrics", "inbox", "diary", "report", "ask", "status", "summary", "log")


def write_codex_home(home: Path, settings: CodexSettings) -> None:
    """config.toml (model, provider, sandbox, approvals) and rules letting the reporting verbs run
    without a prompt. Rewritten at every start, so a changed environment takes effect."""
    home.mkdir(parents=True, exist_ok=True)
    # The approval policy and sandbox go in thread/start (Codex 0.171 refuses to start with
    # `approval_policy = "untrusted"` in config.toml, yet accepts it as a thread parameter).
    # No login shells: a login profile resets PATH (Debian's /etc/profile does for root), and the
    # agent's commands need the PATH the runner gave it, with the `goaltender` verbs on it.
    config: dict[str, Any] = {"allow_login_shell": False}
    if settings.model:
        config["model"] = settings.model
    if settings.context_tokens:
        config["model_context_window"] = settings.context_tokens
    if settings.base_url:
        config["model_provider"] = "goaltender"
    config["sandbox_workspace_write"] = {"network_access": settings.network}
    if settings.base_url:
        provider: dict[str, Any] = {
            "name": "goaltender endpoint",
            "base_url": settings.base_url,
            "wire_api": "responses",
            "env_key": "OPENAI_API_KEY",
        }
        if settings.retries is not None:
            provider |= {"request_max_retries": settings.retries, "stream_max_retries": settings.retries}
        config["model_providers"] = {"goaltender": provider}
    header = "# Written by goaltender's Codex agent at every start; edits are overwritten.\n"
    (home / "config.toml").write_text(header + tomli_w.dumps(config))
    rules = home / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "goaltender.rules").write_text(
        "# Written by goaltender: the reporting verbs only talk to the runner.\n"
        + "".join(
            f'prefix_rule(pattern = ["goaltender", "{verb}"], decision = "allow")\n' for verb in ALLOWED_VERBS
        )
    )


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
