"""Agent settings read the way an agent reads them, from exactly the environment a test gives."""

from __future__ import annotations

import os
from typing import TypeVar

from pydantic_settings import BaseSettings

from goaltender.agents.bootstrap import read_settings

S = TypeVar("S", bound=BaseSettings)


def settings_from(monkeypatch, settings: type[S], **env: str) -> S:
    """`settings` from `env` alone: the test's own GOALTENDER_* and OPENAI_* variables are unset."""
    for name in list(os.environ):
        if name.startswith(("GOALTENDER_", "OPENAI_")):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return read_settings(settings)
