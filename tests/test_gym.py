"""The star-count resources server under real NeMo Gym 0.4.0, in Gym's own Python 3.12 venv.

Once per module: lay out a Gym workspace in a temp dir (star_count copied in as
``resources_servers/star_count``; every server reuses the one Gym venv through Gym's
``skip_venv_if_present``), write the train, validation and held-out splits with
``star_count.export`` run in that venv, start ``gym env start`` (Ray, the head server, star_count,
simple_agent, openai_model) with the project's fake OpenAI server as the policy, then

* Gym's data preparation (``gym dataset collate``) takes the train and validation splits;
* ``/seed_session`` + ``/verify`` over HTTP give our verifier's rewards for the same answers;
* ``gym eval run --no-serve`` collects rollouts, and each row's reward, and the mean in Gym's
  aggregate metrics, are what our verifier says of the fake's answers;
* a SIGINT to ``gym`` stops everything: no process of the run (Ray's included) is left.

The Gym venv comes from ``make gym-venv`` (``make test`` builds it). Without it the test fails,
saying how to build it, unless GOALTENDER_SKIP_GYM=1 (a developer without Python 3.12) skips it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import psutil
import pytest
from fake_openai import FakeOpenAI, Turn

from goaltender.environments.star_count.prompt import format_answer
from goaltender.environments.star_count.verify import score, verify

REPO = Path(__file__).resolve().parents[1]
STAR_COUNT_DIR = REPO / "environments" / "star_count"
AGENT = "star_count_simple_agent"
TRAIN_ROWS = 4
VALIDATION_ROWS = 3
HELDOUT_ROWS = 64  # the fixed held-out split, always whole
START_TIMEOUT_S = 300.0  # Ray alone takes ~7 s on an idle 2-core box; CI runs other tests beside it
STOP_TIMEOUT_S = 60.0


# ---- the Gym venv ----


def gym_venv() -> Path:
    """The venv with nemo-gym 0.4.0: $GOALTENDER_GYM_VENV, else the checkout's .venv-gym link."""
    venv = Path(os.environ.get("GOALTENDER_GYM_VENV") or REPO / ".venv-gym")
    if (venv / "bin" / "gym").exists():
        return venv.resolve()
    why = f"no NeMo Gym venv at {venv} (build it with `make gym-venv`; it needs a Python 3.12)"
    if os.environ.get("GOALTENDER_SKIP_GYM") == "1":
        pytest.skip(why + "; skipped because GOALTENDER_SKIP_GYM=1")
    pytest.fail(why + "; or set GOALTENDER_SKIP_GYM=1 to skip this test", pytrace=False)


# ---- the fake policy: right for some rows, wrong for others, always the same ----


def image_urls(body: dict[str, Any]) -> Iterator[str]:
    """The image data URLs in a Responses API request's input."""
    for message in body.get("input") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "input_image":
                yield part["image_url"]


def scripted_answer(index: int, counts: dict[str, int]) -> str:
    """The fake model's reply to row `index`: exact, one colour off, exact as JSON, or no answer."""
    kind = index % 4
    if kind == 0:
        return "Counted carefully. " + format_answer(counts)
    if kind == 1:
        return format_answer({**counts, "red": counts["red"] + 1})
    if kind == 2:
        return "My answer: " + json.dumps(counts)
    return "I cannot tell."


def answers_by_image(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {
        url: scripted_answer(index, row["counts"])
        for index, row in enumerate(rows)
        for url in image_urls(row["responses_create_params"])
    }


class FakePolicyThread:
    """tests/fake_openai.FakeOpenAI on its own event loop thread, so it serves the Gym processes
    for the whole module while the tests themselves block on subprocesses."""

    def __init__(self, answer: Callable[[dict], Turn]):
        self.fake = FakeOpenAI(default=answer)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> str:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(timeout=30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.close(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def answer_from(answers: dict[str, str]) -> Callable[[dict], Turn]:
    def answer(body: dict) -> Turn:
        for url in image_urls(body):
            if url in answers:
                return Turn(text=answers[url])
        return Turn(text="unknown image")

    return answer


# ---- the workspace ----


def free_port() -> int:
    """A free port for Gym's head server, below the kernel's ephemeral range (32768 up), as Gym
    picks its own servers' (10001-20000): a port from bind(0) is an ephemeral one, which any
    connection the other test workers open may be given between this check and Gym's bind."""
    for _ in range(100):
        port = random.randint(20001, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("", port))  # all interfaces, as Gym checks its ports
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20001 and 32000")


def lay_out_workspace(ws: Path, venv: Path) -> None:
    """Gym resolves server dirs against the cwd first; the .venv links let every server reuse the
    one venv (with ``skip_venv_if_present``) instead of building its own with uv."""
    server = ws / "resources_servers" / "star_count"
    shutil.copytree(STAR_COUNT_DIR, server, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for built_in in ("responses_api_agents/simple_agent", "responses_api_models/openai_model"):
        (ws / built_in).mkdir(parents=True)
        (ws / built_in / ".venv").symlink_to(venv)
    (server / ".venv").symlink_to(venv)
    (ws / "results").mkdir()  # gym eval run writes its outputs there but does not create it


def gym_env(ws: Path, venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # all traffic is local
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",  # "servers ready" must reach the log when it is printed
        RAY_USAGE_STATS_ENABLED="0",
        # A loopback-only cluster of the test's own; token auth would write ~/.ray/auth_token.
        RAY_AUTH_MODE="disabled",
        RAY_TMPDIR=str(ws / "ray"),  # Ray's sessions and sockets stay in the workspace
        HF_HOME=str(ws / "cache" / "huggingface"),
    )
    return env


def write_splits(ws: Path, venv: Path, env: dict[str, str]) -> None:
    """The README's data command, run in the Gym venv from resources_servers/: train.jsonl,
    validation.jsonl and heldout.jsonl in star_count/data/, where configs/star_count.yaml looks."""
    command = [str(venv / "bin" / "python"), "-m", "star_count.export", "--format", "gym"]
    sizes = ["--train", str(TRAIN_ROWS), "--validation", str(VALIDATION_ROWS)]
    subprocess.run(
        [*command, *sizes, "--out-dir", "star_count/data"],
        cwd=ws / "resources_servers",
        env=env,
        check=True,
        timeout=300,
    )


def write_env_yaml(ws: Path, policy_url: str, head_port: int) -> None:
    (ws / "env.yaml").write_text(
        f"policy_base_url: {policy_url}\n"
        "policy_api_key: dummy\n"
        "policy_model_name: fake\n"
        "skip_venv_if_present: true\n"
        f"head_server:\n  host: 127.0.0.1\n  port: {head_port}\n"
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- gym env start, and stopping it ----


@contextlib.contextmanager
def sigint_not_ignored() -> Iterator[None]:
    """A child inherits an ignored SIGINT (as under a shell's background job), and Python then
    never raises KeyboardInterrupt, so gym could not be stopped the way a user stops it. A handler
    is reset to the default at exec, so while it is set the child starts with SIGINT live."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass
class GymServers:
    ws: Path
    venv: Path
    env: dict[str, str]
    head_port: int
    process: subprocess.Popen | None = None
    seen: dict[int, str] = field(default_factory=dict)  # pid -> name of every process of the run
    stopped_by_sigint: bool | None = None

    @property
    def log(self) -> Path:
        return self.ws / "gym_env_start.log"

    def start(self) -> None:
        command = [
            str(self.venv / "bin" / "gym"),
            "env",
            "start",
            "--config",
            "resources_servers/star_count/configs/star_count.yaml",
            "--model-type",
            "openai_model",
        ]
        with self.log.open("wb") as log, sigint_not_ignored():
            # A session of its own: the whole run can be signalled as a group, as a terminal would.
            self.process = subprocess.Popen(
                command,
                cwd=self.ws,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_until_ready()
        self.note_processes()

    def wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while not re.search(r"All (\d+) / \1 servers ready!", self.log.read_text(errors="replace")):
            if self.process.poll() is not None:
                pytest.fail(f"gym env start exited {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"gym env start not ready after {START_TIMEOUT_S}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def note_processes(self) -> None:
        """Remember every process of the run (descendants of gym, and anything naming the
        workspace, e.g. Ray daemons that left the tree), to check later that all have gone."""
        for proc in self.processes_now():
            self.seen.setdefault(proc.pid, proc.name())

    def processes_now(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        if self.process is not None:
            try:
                root = psutil.Process(self.process.pid)
                found = {p.pid: p for p in [root, *root.children(recursive=True)]}
            except psutil.NoSuchProcess:
                pass
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(self.ws) in arg for arg in proc.info["cmdline"] or []):
                found.setdefault(proc.pid, proc)
        found.pop(os.getpid(), None)
        return list(found.values())

    def server_url(self, name: str) -> str:
        # Not through a proxy: the head server is on loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{self.head_port}/server_instances", timeout=10) as reply:
            instances = json.load(reply)
        [url] = [i["url"] for i in instances if i["process_name"] == name]
        return url

    def run_gym(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.venv / "bin" / "gym"), *args],
            cwd=self.ws,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )

    def stop(self) -> list[str]:
        """SIGINT to gym (what Ctrl-C does; gym then stops its servers and Ray), then whatever is
        left of the run gets SIGKILL. Returns the processes that outlived the SIGINT."""
        if self.process is None:
            return []
        self.note_processes()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
                self.stopped_by_sigint = True
            except subprocess.TimeoutExpired:
                self.stopped_by_sigint = False
        leftovers = self.wait_for_processes_to_go(deadline=time.monotonic() + 15)
        for proc in leftovers:
            proc.kill()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        self.process = None
        return [f"{p.pid} {self.seen.get(p.pid, '?')}" for p in leftovers]

    def wait_for_processes_to_go(self, deadline: float) -> list[psutil.Process]:
        while True:
            alive = [p for p in self.still_running() if p.pid != self.process_pid()]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)

    def process_pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def still_running(self) -> list[psutil.Process]:
        alive = {p.pid: p for p in self.processes_now()}
        for pid in self.seen:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.setdefault(pid, proc)
            except psutil.NoSuchProcess:
                pass
        return [p for p in alive.values() if p.status() != psutil.STATUS_ZOMBIE]


@dataclass
class Gym:
    servers: GymServers
    fake: FakeOpenAI
    heldout: list[dict[str, Any]]


@pytest.fixture(scope="module")
def gym() -> Iterator[Gym]:
    venv = gym_venv()
    ws = Path(tempfile.mkdtemp(prefix="gym-"))  # short: Ray's socket paths are limited to 107 bytes
    policy: FakePolicyThread | None = None
    servers: GymServers | None = None
    try:
        env = gym_env(ws, venv)
        lay_out_workspace(ws, venv)
        write_splits(ws, venv, env)
        heldout = read_jsonl(ws / "resources_servers/star_count/data/heldout.jsonl")
        policy = FakePolicyThread(answer_from(answers_by_image(heldout)))
        head_port = free_port()
        write_env_yaml(ws, policy.start(), head_port)
        servers = GymServers(ws, venv, env, head_port)
        servers.start()
        yield Gym(servers, policy.fake, heldout)
    finally:
        if servers is not None:
            servers.stop()
        if policy is not None:
            policy.stop()
        shutil.rmtree(ws, ignore_errors=True)


# ---- the checks ----


def response_with(text: str) -> dict[str, Any]:
    """A minimal Responses API object carrying the answer text, as the agent sends to /verify."""
    message = {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": "resp_test",
        "object": "response",
        "created_at": 0,
        "model": "fake",
        "output": [message],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


class GymHttp:
    """HTTP to a Gym server the way Gym's clients talk to it: JSON bodies, one cookie session."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        # No proxies: the servers are on loopback.
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPCookieProcessor(CookieJar())
        )

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with self.opener.open(request, timeout=30) as reply:
            return json.load(reply)


def check_gym_prepares_the_generators_train_and_validation_splits(gym: Gym) -> None:
    done = gym.servers.run_gym(
        "dataset",
        "collate",
        "--config",
        "resources_servers/star_count/configs/star_count.yaml",
        "--model-type",
        "openai_model",
        "--mode",
        "train_preparation",
        "--output-dir",
        "results/prepared",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    prepared = gym.servers.ws / "results" / "prepared"
    data = gym.servers.ws / "resources_servers" / "star_count" / "data"
    for split in ("train", "validation"):
        ours = read_jsonl(data / f"{split}.jsonl")
        theirs = read_jsonl(prepared / f"{split}.jsonl")
        assert [r["seed"] for r in theirs] == [r["seed"] for r in ours]
        assert [r["counts"] for r in theirs] == [r["counts"] for r in ours]
        metrics = json.loads((prepared / f"{split}_metrics.json").read_text())
        assert (metrics["type"], metrics["Number of examples"]) == (split, len(ours))
    assert len(read_jsonl(data / "train.jsonl")) == TRAIN_ROWS
    assert len(read_jsonl(data / "validation.jsonl")) == VALIDATION_ROWS


def check_verify_over_http_gives_our_verifiers_rewards(gym: Gym) -> None:
    http = GymHttp(gym.servers.server_url("star_count"))
    checked = 0
    for row in gym.heldout[:4]:
        counts = row["counts"]
        answers = [scripted_answer(kind, counts) for kind in range(4)]
        answers += [
            rf"\boxed{{red: {counts['red']}}}",
            "red=9 green=9 blue=9",
        ]  # green, blue missing; all wrong
        for answer in answers:
            assert http.post("/seed_session", row) == {}
            verdict = http.post("/verify", {**row, "response": response_with(answer)})
            ours = verify(counts, answer)
            assert (verdict["reward"], verdict["correct"]) == (ours.reward, ours.correct), answer
            assert verdict["predicted"] == ours.predicted and verdict["per_colour_correct"] == ours.per_colour
            assert verdict["counts"] == counts and verdict["seed"] == row["seed"]  # the row travels through
            checked += 1
    assert checked == 24


def check_gym_eval_run_rewards_match_our_verifier(gym: Gym) -> None:
    output = gym.servers.ws / "results" / "heldout_rollouts.jsonl"
    done = gym.servers.run_gym(
        "eval",
        "run",
        "--no-serve",
        "--agent",
        AGENT,
        "--input",
        "resources_servers/star_count/data/heldout.jsonl",
        "--output",
        str(output.relative_to(gym.servers.ws)),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    rollouts = sorted(read_jsonl(output), key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
    assert [r["_ng_task_index"] for r in rollouts] == list(range(HELDOUT_ROWS))
    expected_answers = [scripted_answer(i, row["counts"]) for i, row in enumerate(gym.heldout)]
    for rollout, row, answer in zip(rollouts, gym.heldout, expected_answers, strict=True):
        assert rollout["seed"] == row["seed"] and rollout["counts"] == row["counts"]
        assert rollout["response"]["output"][-1]["content"][0]["text"] == answer  # the fake's, for this image
        ours = verify(row["counts"], answer)
        assert (rollout["reward"], rollout["correct"]) == (ours.reward, ours.correct)
    assert read_jsonl(output.with_name(output.stem + "_failures.jsonl")) == []

    ours = score(gym.heldout, expected_answers)
    [metrics] = json.loads(output.with_name(output.stem + "_aggregate_metrics.json").read_text())
    print(f"gym key_metrics {metrics['key_metrics']}; verify(): {ours}")  # shown by pytest -rP
    assert metrics["key_metrics"] == pytest.approx(
        {"mean/reward": ours["mean_reward"], "mean/correct": ours["exact_accuracy"]}
    )
    assert metrics["agent_metrics"]["mean/reward"] == pytest.approx(ours["mean_reward"])
    # Each held-out image went to the fake once, through simple_agent and openai_model.
    assert len([seen for seen in gym.fake.requests if seen.path == "responses"]) == HELDOUT_ROWS


def check_sigint_stops_every_process_of_the_run(gym: Gym) -> None:
    servers = gym.servers
    assert servers.server_url("star_count").startswith("http://127.0.0.1:")
    names = set(servers.seen.values())
    assert any("raylet" in n or "gcs_server" in n for n in names), names  # Ray really ran
    leftovers = servers.stop()
    assert servers.stopped_by_sigint, f"gym ignored SIGINT for {STOP_TIMEOUT_S}s"
    assert leftovers == [], f"left running after gym stopped: {leftovers}"


def test_star_count_under_real_nemo_gym(gym: Gym, subtests):
    """One test, one Gym run (Ray and three servers start once), each check a subtest of its own:
    pytest-xdist would spread separate tests over workers, each starting its own Gym (its
    xdist_group grouping does not work with pytest 9)."""
    checks = [
        check_gym_prepares_the_generators_train_and_validation_splits,
        check_verify_over_http_gives_our_verifiers_rewards,
        check_gym_eval_run_rewards_match_our_verifier,
        check_sigint_stops_every_process_of_the_run,  # last: it stops the servers
    ]
    for check in checks:
        with subtests.test(check.__name__.removeprefix("check_")):
            check(gym)
