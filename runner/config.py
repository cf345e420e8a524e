"""Runner configuration: `GOALTENDER_*` environment variables, or a TOML file (GOALTENDER_CONFIG)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from goaltender.storage.db import private_directory

DEFAULT_GRANTS = ("OPENAI_API_KEY", "GOALTENDER_OPENAI_API_KEY", "HF_TOKEN")
"""What the built-in agents need (the model endpoint's key) and what experiments commonly need
(gated model downloads); the Slack tokens are never among them."""


def _default_agents() -> dict[str, list[str]]:
    return {
        name: [sys.executable, "-m", f"goaltender.agents.{module}"]
        for name, module in (("sweep", "sweep"), ("openai", "openai_agent"), ("codex", "codex_agent"))
    }


class ConfigError(ValueError):
    """A setting this machine cannot honour (an operator with no account here); the message names
    its variable."""


_SECRET_WORDS = ("token", "secret", "key", "password")


def settings_problem(exc: BaseException) -> str | None:
    """What is wrong with the configuration, when `exc` says so (a settings model refused a value, a
    variable is not the JSON it must be, a ConfigError): one line, each mistake naming its variable
    and what it held (not for secrets). None when `exc` is about something else."""
    if isinstance(exc, ConfigError):
        return str(exc)
    if isinstance(exc, SettingsError):  # a JSON-valued variable that does not parse
        quoted = str(exc).split('"')  # 'error parsing value for field "agents" from source …'
        field = quoted[1] if len(quoted) > 2 else "?"
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        return f"bad configuration: GOALTENDER_{field.upper()} is not the JSON it must be{cause}"
    if not isinstance(exc, ValidationError) or exc.title not in _settings_models(GoaltenderSettings):
        return None
    mistakes = []
    for error in exc.errors():
        field, *inner = [str(part) for part in error["loc"]] or ["?"]
        name = field if field.isupper() else f"GOALTENDER_{field.upper()}"
        if name not in os.environ and (config := os.environ.get("GOALTENDER_CONFIG")):
            name = f"{field} in {config}"
        where = name + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in inner)
        held = error.get("input")
        secret = any(word in part.lower() for part in (field, *inner) for word in _SECRET_WORDS)
        shown = "" if secret or isinstance(held, dict) else f" (got {str(held)[:60]!r})"
        mistakes.append(f"{where}: {error['msg']}{shown}")
    return "bad configuration: " + "; ".join(mistakes)


def _settings_models(cls: type[BaseSettings]) -> set[str]:
    names = {cls.__name__}
    for sub in cls.__subclasses__():
        names |= _settings_models(sub)
    return names


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
            if not Path(config).is_file():  # a typo in the path would quietly run on the defaults
                raise ConfigError(f"GOALTENDER_CONFIG is {config}, which is no file")
            try:
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config))
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"GOALTENDER_CONFIG {config} is not TOML: {exc}") from None
        return tuple(sources)


class RunnerSettings(GoaltenderSettings):
    home: Path = Field(default_factory=lambda: Path.home() / ".goaltender")
    """State lives here: runner.db, runner.sock, workspaces/, cache/, agents/ (the goals'
    sockets), tmp/ (the goals' /tmp), limits.json (the per-goal limits it applies). Put it on
    the big disk."""
    name: str = Field(default_factory=lambda: os.uname().nodename)
    socket: Path | None = None  # default: <home>/runner.sock
    default_agent: str = "sweep"
    agents: dict[str, list[str]] = Field(default_factory=_default_agents)
    """Agent name -> command. The runner adds GOALTENDER_SOCKET / _GOAL_ID / _WORKSPACE to its env."""
    approval_timeout_s: float = 3600.0
    experiment_timeout_s: float = 3600.0
    stop_grace_s: float = 5.0
    max_input_mb: float = Field(default=25.0, gt=0)
    """The largest file (MB) people may give a goal (a paper attached in its Slack thread: it goes
    into the goal's workspace, inputs/; runner/inputs.py). Larger ones are refused whole."""
    min_free_mb: float = Field(default=1024.0, ge=0)
    """Free space (MB) the home's disk must keep: below it no new experiment starts, and its goal
    pauses (with a message in its thread) until space returns."""
    goal_disk_gb: float | None = Field(default=None, ge=0)
    """The most disk a goal may hold (GB: its workspace, its caches, its /tmp; runner/goal_disk.py).
    Past it its runs stop and it pauses. Default: half of the disk the home is on; 0: no cap."""
    goal_disk_check_s: float = Field(default=15.0, gt=0)
    """How often each goal's disk is measured against its cap."""
    disk_check_s: float = Field(default=5.0, gt=0)
    """How often a goal paused for a full disk, or a write waiting for space, looks again."""
    compute_unit: Literal["auto", "gpu", "cpu"] = "auto"
    slots: int | None = Field(default=None, ge=1)
    """How many experiments run on this box at once (GOALTENDER_SLOTS); default: one per CPU core.
    The rest wait in a fair queue (runner/slots.py)."""
    gpus_per_experiment: int | None = Field(default=None, ge=0)
    """GPUs an experiment gets unless it or its goal says: default 1 on a box with GPUs, else 0."""
    executor: Literal["local", "ray", "slurm"] = "local"
    """Where experiments run unless they or their goal say: this box, a Ray cluster, Slurm."""
    executors: Annotated[list[Literal["local", "ray", "slurm"]], NoDecode] = Field(default_factory=list)
    """Remote executors goals may use besides `executor` (comma-separated or a JSON list); local,
    in the goal's sandbox, is always allowed. A remote one runs a goal's commands outside its sandbox, as the runner's user on the cluster's
    nodes: allow it only where the cluster is the isolation you want (docs/security.md)."""
    ray_address: str = "http://127.0.0.1:8265"
    """The Ray cluster's dashboard (its Job Submission API) for `--executor ray`."""
    ray_token: str = ""
    """Bearer token for a Ray cluster with token auth (RAY_AUTH_MODE=token)."""
    slurm_partition: str = ""
    slurm_args: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """More sbatch options for every Slurm job, e.g. --account=lab --qos=normal (space-separated)."""
    keep_checkpoints: int = Field(default=3, ge=0)
    """Checkpoints a goal keeps when an experiment ends: the best this many, and the latest; 0
    keeps them all."""
    retention_days: int = Field(default=90, ge=0, le=100_000)
    """Goals that ended this many days ago lose their events and their runs' logs (the best run's
    log, the ledger, diary, audit and final report are kept; storage/pruning.py); 0 keeps all."""
    prune_every_s: float = Field(default=86_400.0, gt=0)
    """How often the runner prunes (the first time a minute after it starts)."""
    noise_ask_after: int = Field(default=2, ge=0)
    """After this many kept results in a row whose gains are within noise, the humans are asked how
    to go on (repeat seeds, a larger eval split, longer runs, another direction); 0 never asks."""
    milestone_burst: int = Field(default=10, ge=1)
    """Posts a goal's agent may make to its thread at once (milestones, fetches; runner/folding.py):
    past it, and past GOALTENDER_MILESTONES_PER_MINUTE, they are folded into one post."""
    milestones_per_minute: float = Field(default=6.0, gt=0)
    """How fast a goal's burst comes back: its sustained rate of milestone posts. Slack takes ~60
    messages a minute per channel; the default leaves room for ten goals posting flat out."""
    gpu_sample_s: float = Field(default=5.0, gt=0)
    """How often a run's GPUs are sampled (memory, utilisation) for its ledger row."""
    operators: Annotated[list[int | str], NoDecode] = Field(default_factory=list)
    """Who may control goals over the runner socket, by the peer's uid: user names, uids, and
    groups as @name or @gid (their members), comma-separated or a JSON list. Default: the user the
    runner runs as. The runner lets them reach the socket with ACL entries (runner/operators.py)."""
    sandbox: Literal["bwrap", "none"] = "bwrap"
    """Where agents and experiments run: bwrap (bubblewrap; they cannot reach the runner's state or
    the operator socket), or none — unsandboxed, which lets them control every goal."""
    sandbox_network: Literal["isolated", "host", "none"] = "isolated"
    """What a goal's sandboxes reach (runner/goal_network.py): isolated, a network namespace per
    goal with a way out through slirp4netns but none to the box's loopback services or abstract
    sockets, except the allowed ports; none, the goal's own loopback alone; host, the box's
    network as it is."""
    sandbox_ports: Annotated[list[Annotated[int, Field(ge=1, le=65535)]], NoDecode] = Field(
        default_factory=list
    )
    """Loopback ports of the box that isolated goals may reach, besides those the runner's variables
    for services goals use name (OPENAI_BASE_URL=http://127.0.0.1:8080/v1, HF_ENDPOINT, a proxy:
    runner/goal_network.py GOAL_SERVICES). Comma-separated."""
    goal_pids: int = Field(default=8192, ge=16)
    """Processes (threads count) each goal may have at once: its agent, runs, evals and standbys
    together (runner/limits.py). Past it their forks fail, so a fork bomb stays in its goal."""
    goal_memory_mb: int | None = Field(default=None, ge=32)
    """Memory (MB, swap included) each goal's processes may hold together; past it the kernel's
    OOM killer ends one of them (the largest). Default: the box's memory less max(1 GiB, 10%)."""
    goal_cpu_weight: int = Field(default=100, ge=1, le=10000)
    """A goal's share of the CPU when it is short, against the other goals' (cgroup v2's scale:
    1-10000; every goal 100 by default, so equal shares)."""
    standby: bool = True
    """Keep a sandboxed Python interpreter ready for each running goal's next run or eval, with
    `preload` imported (runner/standby.py): a `python -m …` or `python script.py …` command with
    the runner's own interpreter starts at once. Sandboxed runners only."""
    preload: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Modules a standby imports while it waits (comma-separated or a JSON list), for the
    workloads this box runs; none by default. Only list modules whose import depends on nothing
    the commands do first: a command that sets OMP_NUM_THREADS itself and then imports numpy gets
    a preloaded numpy that has already read it. Nor may they read CUDA_VISIBLE_DEVICES, or
    GOALTENDER_EXPERIMENT_* and GOALTENDER_SEED, on import: those are set at hand-off."""
    secrets: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """More secrets to redact and keep from agents: environment variable names, or paths of files
    that each hold one (an entry with a '/'). Comma-separated or a JSON list."""
    grants: Annotated[list[str], NoDecode] = Field(default_factory=lambda: list(DEFAULT_GRANTS))
    """Secret environment variables every goal's agent and experiments keep (still redacted on the
    way out). Comma-separated or a JSON list; empty grants nothing."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve Prometheus metrics on this port (runner/monitoring.py; 0: any free port, logged);
    unset: no endpoint."""
    metrics_address: str = "127.0.0.1"
    """Where the metrics endpoint listens: this box alone by default; 0.0.0.0 for every interface."""
    log_format: Literal["text", "json"] = "text"
    """The runner's log on stderr: lines of text, or one JSON object a line (runner/logs.py)."""
    mlflow: bool = False
    """Mirror goals, the ledger and series to MLflow (the `mlflow` extra; runner/mlflow_mirror.py),
    by default into sqlite:///<home>/mlflow.db."""
    mlflow_tracking_uri: str = ""
    """Where to mirror to (http://mlflow.internal:5000, sqlite:///…); setting it turns mirroring on.
    `sqlite`: the default file."""

    @field_validator("home", "socket")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        """A relative home (or `~/…`) made absolute as the runner starts: the sandboxes it makes
        later see other working directories (every goal failed with a relative GOALTENDER_HOME)."""
        return None if value is None else Path(os.path.abspath(value.expanduser()))

    @field_validator("slurm_args", mode="before")
    @classmethod
    def _words(cls, value: object) -> object:
        if isinstance(value, str):
            return json.loads(value) if value.lstrip().startswith("[") else shlex.split(value)
        return value

    @field_validator("secrets", "grants", "operators", "preload", "executors", "sandbox_ports", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @property
    def mlflow_uri(self) -> str | None:
        """The MLflow tracking URI to mirror to; None: no mirroring."""
        uri = self.mlflow_tracking_uri.strip()
        if uri in ("", "sqlite"):
            return f"sqlite:///{self.home / 'mlflow.db'}" if self.mlflow or uri else None
        return uri

    @property
    def allowed_executors(self) -> list[str]:
        """Where this runner's goals may run experiments: in their sandbox here, the default
        executor, and those `executors` names."""
        return list(dict.fromkeys(["local", self.executor, *self.executors]))

    @property
    def socket_path(self) -> Path:
        return self.socket or self.home / "runner.sock"

    @property
    def db_path(self) -> Path:
        return self.home / "runner.db"

    @property
    def lost_marker(self) -> Path:
        """Left when runner.db was lost under the runner, saying so; starts wait until it is removed."""
        return self.home / "database-lost.txt"

    @property
    def workspaces(self) -> Path:
        return self.home / "workspaces"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @property
    def hub_cache(self) -> Path:
        """The Hugging Face hub cache every goal shares: read-only in their sandboxes (at this same
        path, HF_HUB_CACHE), written only by the runner's own downloads (runner/fetches.py)."""
        return self.hub_cache_in(os.environ)

    def hub_cache_in(self, env: Mapping[str, str]) -> Path:
        """The hub cache of a runner started with `env`, as huggingface_hub reads it: HF_HUB_CACHE,
        else $HF_HOME/hub, else cache/huggingface/hub."""
        if chosen := env.get("HF_HUB_CACHE"):
            return _absolute_path(chosen)
        if home := env.get("HF_HOME"):
            return _absolute_path(home) / "hub"
        return self.cache_dir / "huggingface" / "hub"

    def goal_cache(self, goal_id: int) -> Path:
        """The goal's own caches (pip, uv, torch, triton, HF_HOME but its hub…): one goal's cache is
        never another's, which would load and run what the first left there. Removed with the goal."""
        return self.cache_dir / "goals" / f"goal-{goal_id}"

    @property
    def skill_folder(self) -> Path:
        """The box's skills (runner/skill_folder.py); agents/briefing.py finds it the same way."""
        return self.home / "skills"

    def agent_socket(self, goal_id: int) -> Path:
        """The goal's capability: its agent's (and experiments') socket, listened on while it runs."""
        return self.home / "agents" / f"goal-{goal_id}.sock"

    def goal_tmp(self, goal_id: int) -> Path:
        """The goal's /tmp inside the sandbox, on the big disk; removed when the goal ends."""
        return self.home / "tmp" / f"goal-{goal_id}"

    def make_dirs(self) -> None:
        """The home, workspaces/ and cache/: this user's alone (0700, tightened if they exist)."""
        for directory in (self.home, self.workspaces, self.cache_dir):
            private_directory(directory)


def _absolute_path(value: str) -> Path:
    """A path from the environment as huggingface_hub expands it (~, $VARS), made absolute: the
    sandboxes see it at the same place."""
    return Path(os.path.abspath(os.path.expandvars(os.path.expanduser(value))))
