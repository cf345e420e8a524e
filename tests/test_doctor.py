"""goaltender doctor: the real CLI on this box (a temp home, a running runner), and each check
against fakes: NVML with 2 GPUs and with none, an OpenAI-compatible endpoint up and dead, a hub
up, refusing and unreachable, NeMo RL checkouts and Gym venvs made here. Planted keys never show."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from fake_hub import FakeHub
from fake_openai import FakeOpenAI

from goaltender.runner import doctor
from goaltender.runner.agent_env import CACHE_DIRS
from goaltender.runner.config import RunnerSettings
from goaltender.runner.doctor import (
    CHECKS,
    Box,
    check_caches,
    check_disk,
    check_gpu,
    check_limits,
    check_nemo_gym,
    check_nemo_rl,
    check_nemo_rl_venv,
    check_runner,
    check_sandbox,
    check_ssh,
    run_checks,
)
from goaltender.runner.gpus import Gpu, Gpus, NoDriver

GOALTENDER = str(Path(sys.executable).parent / "goaltender")
FAKE_NVML = Path(__file__).parent / "fake_nvml"
OPENAI_KEY = "sk-doctor-planted-0123456789abcdef"
HF_TOKEN = "hf_doctorPlantedToken0123456789"
LEFT_OUT = ("HF_", "OPENAI_", "GOALTENDER_", "NEMO_", "CUDA_VISIBLE_DEVICES", "HUGGING_FACE")
PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def box_env(home: Path, **extra: str) -> dict[str, str]:
    """This machine's environment without anything the doctor reads (caches, hub, endpoint,
    goaltender settings), then `extra`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in CACHE_DIRS and name not in PROXIES and not name.startswith(LEFT_OUT)
    }
    return env | {"HOME": str(home)} | extra


def make_box(tmp_path: Path, env: dict[str, str] | None = None, **fields) -> Box:
    settings = RunnerSettings(home=tmp_path / "home", socket=tmp_path / "runner.sock", min_free_mb=64)
    user_home = tmp_path / "user"
    user_home.mkdir(exist_ok=True)
    return Box(settings, env if env is not None else box_env(user_home), user_home=user_home, **fields)


async def run_doctor(env: dict[str, str], *args: str) -> tuple[int, str]:
    """The real `goaltender doctor`, asynchronously: the fakes it talks to run on this loop."""
    process = await asyncio.create_subprocess_exec(
        GOALTENDER,
        "doctor",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, output.decode()


def line(output: str, name: str) -> str:
    found = [row for row in output.splitlines() if row[5:].startswith(f"{name}: ")]
    assert len(found) == 1, (name, output)
    return found[0]


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    """A tiny HTTP server answering GET paths from a table, remembering each request's headers."""

    def __init__(self, routes: dict[str, tuple[int, object]]):
        self.routes = routes
        self.seen: list[tuple[str, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/{path:.*}", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, dict(request.headers)))
        status, body = self.routes.get(request.path, (404, {"error": "not found"}))
        return web.json_response(body, status=status)


# ---- the real CLI on this box ----


async def test_doctor_on_this_box_with_a_running_runner(start_runner, tmp_path):
    runner = await start_runner()
    user_home = tmp_path / "user"
    user_home.mkdir()
    env = box_env(
        user_home,
        GOALTENDER_HOME=str(runner.settings.home),
        GOALTENDER_SOCKET=str(runner.settings.socket_path),
        GOALTENDER_MIN_FREE_MB="64",
        GOALTENDER_GYM_VENV=str(tmp_path / "no-gym-venv"),
        HF_HUB_OFFLINE="1",
        HF_TOKEN=HF_TOKEN,
    )
    code, output = await run_doctor(env)

    assert code == 0, output
    rows = output.splitlines()
    assert [row[5:].split(":")[0] for row in rows if row[:5] in ("ok   ", "warn ", "fail ")] == list(CHECKS)
    assert line(output, "python").startswith("ok   python: Python 3.")
    if check_gpu(make_box(tmp_path)).status == "warn":  # no driver on this machine (or no GPU)
        assert "no NVIDIA driver" in line(output, "gpu") and "charged CPU-hours" in line(output, "gpu")
    # HOME is a directory on the same filesystem as GOALTENDER_HOME here: the doctor says so.
    assert line(output, "disk").startswith("warn disk: ") and "the same filesystem as HOME" in output
    cache = runner.settings.cache_dir
    assert line(output, "caches") == (
        f"ok   caches: each goal's own caches ({len(CACHE_DIRS)} variables) under {cache / 'goals'}, "
        f"removed with the goal; the hub cache {cache / 'huggingface' / 'hub'}, shared, read-only to goals"
    )
    assert line(output, "nemo-rl").startswith("warn nemo-rl: no checkout configured (NEMO_RL_DIR)")
    assert "git clone --recursive --branch v0.7.0 https://github.com/NVIDIA-NeMo/RL" in line(
        output, "nemo-rl"
    )
    assert line(output, "nemo-gym").startswith(f"warn nemo-gym: no venv at {tmp_path / 'no-gym-venv'}")
    assert "offline mode (HF_HUB_OFFLINE): 0 models cached" in line(output, "hub")
    assert "HF_TOKEN set (not shown)" in line(output, "hub")
    assert line(output, "model").startswith("warn model: not configured")
    assert line(output, "runner") == (
        f"ok   runner: test-runner answers on {runner.settings.socket_path} (database {runner.store.runner_id})"
    )
    assert line(output, "sandbox").startswith("ok   sandbox: bubblewrap ")
    limits = runner.campaigns.limits
    if limits.tree is not None:  # what the running runner applies (it may run in another cgroup)
        assert (
            line(output, "limits")
            == f"ok   limits: the runner (pid {os.getpid()}) holds each goal to {limits.text()}"
        )
    else:
        assert line(output, "limits").startswith(
            f"warn limits: the runner (pid {os.getpid()}) runs goals without"
        )
    assert line(output, "ssh").startswith(
        ("ok   ssh: sshd answers", "warn ssh: nothing answers on localhost:22")
    )
    assert "goaltender bot --check" in line(output, "ssh")
    assert f'"remote_socket": "{runner.settings.socket_path}"' in output  # the bot's entry, beneath
    assert rows[-1].startswith("doctor: ") and rows[-1].endswith("0 fail")
    for row in rows:
        if row.startswith(("warn ", "fail ")):
            assert " — fix: " in row, row
    assert HF_TOKEN not in output


async def test_json_output_parses_and_a_failure_exits_1(tmp_path):
    user_home = tmp_path / "user"
    user_home.mkdir()
    env = box_env(
        user_home,
        GOALTENDER_HOME=str(tmp_path / "home"),
        GOALTENDER_MIN_FREE_MB=str(10**12),  # no disk has that much room: disk fails
        GOALTENDER_GYM_VENV=str(tmp_path / "no-gym-venv"),
        HF_HUB_OFFLINE="1",
    )
    code, output = await run_doctor(env, "--json")
    findings = json.loads(output)
    assert code == 1
    assert [f["name"] for f in findings] == list(CHECKS)
    assert all(set(f) == {"name", "status", "detail", "fix", "snippet"} for f in findings)
    disk = next(f for f in findings if f["name"] == "disk")
    assert disk["status"] == "fail" and "under GOALTENDER_MIN_FREE_MB" in disk["detail"]
    runner = next(f for f in findings if f["name"] == "runner")
    assert runner["status"] == "warn" and runner["detail"].startswith("not running (no socket at ")


async def test_a_bad_setting_is_one_fail_line(tmp_path):
    env = box_env(tmp_path, GOALTENDER_MIN_FREE_MB="lots")
    code, output = await run_doctor(env)
    assert code == 1
    assert output.startswith("fail config: ") and "min_free_mb" in output and "Traceback" not in output


# ---- GPUs: NVML faked ----


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (
            [("NVIDIA H100 80GB HBM3", 81559)] * 2,
            "ok   gpu: 2 GPUs: 2 × NVIDIA H100 80GB HBM3 (81,559 MiB); driver 550.54.15, CUDA 12.4",
        ),
        (None, "warn gpu: no NVIDIA driver (Driver Not Loaded): CPU only, experiments are charged CPU-hours"),
    ],
)
async def test_gpus_through_a_fake_nvml_module(tmp_path, gpus, expected):
    # The real read_gpus, in the real CLI, over a pynvml that answers like a 2-GPU box (or a box
    # with no driver).
    devices = None if gpus is None else [{"name": name, "memory_mib": mib} for name, mib in gpus]
    (tmp_path / "nvml.json").write_text(json.dumps({"devices": devices}))
    env = box_env(
        tmp_path,
        PYTHONPATH=str(FAKE_NVML),
        FAKE_NVML_STATE=str(tmp_path / "nvml.json"),
        GOALTENDER_HOME=str(tmp_path / "home"),
        GOALTENDER_GYM_VENV=str(tmp_path / "none"),
        HF_HUB_OFFLINE="1",
    )
    _, output = await run_doctor(env)
    assert line(output, "gpu").startswith(expected)


def test_gpu_check_with_an_injected_reader(tmp_path):
    def two_gpus() -> Gpus:
        return Gpus("550.54.15", "12.4", [Gpu(0, "NVIDIA A100-SXM4-40GB", 40960), Gpu(1, "NVIDIA L4", 23034)])

    def no_driver() -> Gpus:
        raise NoDriver("NVML Shared Library Not Found")

    def broken() -> Gpus:
        raise RuntimeError("GPU is lost")

    found = check_gpu(make_box(tmp_path, read_gpus=two_gpus))
    assert found.status == "ok"
    assert found.detail.startswith(
        "2 GPUs: 1 × NVIDIA A100-SXM4-40GB (40,960 MiB), 1 × NVIDIA L4 (23,034 MiB)"
    )
    env = box_env(tmp_path, CUDA_VISIBLE_DEVICES="1")
    assert "CUDA_VISIBLE_DEVICES=1 limits" in check_gpu(make_box(tmp_path, env, read_gpus=two_gpus)).detail
    none = check_gpu(make_box(tmp_path, read_gpus=no_driver))
    assert none.status == "warn" and "CPU only" in none.detail and "install the NVIDIA driver" in none.fix
    assert check_gpu(make_box(tmp_path, read_gpus=lambda: Gpus("550", "12.4", []))).status == "warn"
    assert check_gpu(make_box(tmp_path, read_gpus=broken)).status == "fail"


# ---- the model endpoint ----


async def test_model_endpoint_up_dead_and_refusing(tmp_path):
    fake = FakeOpenAI()
    base_url = await fake.start()
    refusing = Recorder({"/v1/models": (401, {"error": {"message": "bad key"}})})
    refusing_url = await refusing.start()
    common = {"GOALTENDER_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": OPENAI_KEY}
    try:
        env = box_env(tmp_path, OPENAI_BASE_URL=base_url, GOALTENDER_MODEL="fake-model", **common)
        _, up = await run_doctor(env)
        assert line(up, "model") == (
            f"ok   model: {base_url} serves 1 model: fake-model; OPENAI_API_KEY set (not shown); "
            "GOALTENDER_MODEL=fake-model"
        )

        env = box_env(tmp_path, OPENAI_BASE_URL=base_url, GOALTENDER_MODEL="other", **common)
        _, wrong = await run_doctor(env)
        assert (
            line(wrong, "model").startswith("warn model: ") and "GOALTENDER_MODEL=other is not among" in wrong
        )

        # The key in the URL too: neither the URL's credentials nor the key are ever shown.
        dead = f"http://user:{OPENAI_KEY}@127.0.0.1:{dead_port()}/v1"
        code, down = await run_doctor(box_env(tmp_path, OPENAI_BASE_URL=dead, **common))
        assert code == 1
        assert line(down, "model").startswith("fail model: cannot reach http://127.0.0.1:")

        env = box_env(tmp_path, GOALTENDER_OPENAI_BASE_URL=f"{refusing_url}/v1", **common)
        code, refused = await run_doctor(env, "--json")
        model = next(f for f in json.loads(refused) if f["name"] == "model")
        assert code == 1 and model["status"] == "fail" and "refused the key (HTTP 401" in model["detail"]
        assert refusing.seen[0][1]["Authorization"] == f"Bearer {OPENAI_KEY}"  # sent, never shown
        for output in (up, wrong, down, refused):
            assert OPENAI_KEY not in output
    finally:
        await fake.close()
        await refusing.close()


# ---- the hub ----


async def test_hub_up_refusing_unreachable_and_offline(tmp_path):
    hub = Recorder({"/api/models/openai-community/gpt2": (200, {"id": "openai-community/gpt2"})})
    hub_url = await hub.start()
    refusing = Recorder({"/api/models/openai-community/gpt2": (401, {"error": "Invalid credentials"})})
    refusing_url = await refusing.start()
    home = {"GOALTENDER_HOME": str(tmp_path / "home"), "GOALTENDER_GYM_VENV": str(tmp_path / "none")}
    try:
        env = box_env(tmp_path, HF_ENDPOINT=hub_url, HF_TOKEN=HF_TOKEN, **home)
        _, up = await run_doctor(env)
        assert line(up, "hub") == f"ok   hub: {hub_url} answers (HTTP 200); HF_TOKEN set (not shown)"
        assert hub.seen[0][1]["Authorization"] == f"Bearer {HF_TOKEN}"

        env = box_env(tmp_path, HF_ENDPOINT=refusing_url, HF_TOKEN=HF_TOKEN, **home)
        code, refused = await run_doctor(env)
        assert code == 1 and line(refused, "hub").startswith(f"fail hub: {refusing_url} refused the token")

        env = box_env(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{dead_port()}", HF_TOKEN=HF_TOKEN, **home)
        code, down = await run_doctor(env)
        assert code == 1 and line(down, "hub").startswith("fail hub: cannot reach http://127.0.0.1:")
        assert "fix: set HF_ENDPOINT to a mirror this box reaches, or HF_HUB_OFFLINE=1" in down

        cached = tmp_path / "home" / "cache" / "huggingface" / "hub" / "models--Qwen--Qwen3-VL-2B-Instruct"
        cached.mkdir(parents=True)
        _, offline = await run_doctor(box_env(tmp_path, HF_HUB_OFFLINE="1", **home))
        assert line(offline, "hub").startswith("ok   hub: offline mode (HF_HUB_OFFLINE): 1 model cached in ")
        for output in (up, refused, down, offline):
            assert HF_TOKEN not in output
    finally:
        await hub.close()
        await refusing.close()


MIRROR_PASSWORD = "Pl4nted-doctor-mirror-pass"


async def test_a_mirror_behind_a_login_is_reached_with_it_and_it_never_shows(tmp_path):
    """HF_ENDPOINT=http://user:password@host: doctor asked for the host `user:password@host` (and
    said "cannot reach … (Name or service not known)"); huggingface_hub sends the login as basic
    auth, and so does doctor now."""
    mirror = FakeHub()
    mirror.add_repo("openai-community/gpt2", {"config.json": b"{}"})
    mirror.login = ("ana", MIRROR_PASSWORD)
    mirror.start()
    home = {"GOALTENDER_HOME": str(tmp_path / "home"), "GOALTENDER_GYM_VENV": str(tmp_path / "none")}
    with_login = mirror.url.replace("http://", f"http://ana:{MIRROR_PASSWORD}@")
    try:
        _, up = await run_doctor(box_env(tmp_path, HF_ENDPOINT=with_login, HF_TOKEN=HF_TOKEN, **home))
        assert line(up, "hub") == f"ok   hub: {mirror.url} answers (HTTP 200); HF_TOKEN set (not shown)"
        assert [seen.path for seen in mirror.requests] == ["/api/models/openai-community/gpt2"]

        wrong = mirror.url.replace("http://", "http://ana:not-it@")
        code, refused = await run_doctor(box_env(tmp_path, HF_ENDPOINT=wrong, **home))
        assert code == 1 and line(refused, "hub") == (
            f"fail hub: {mirror.url} refused the user:password@ in HF_ENDPOINT's address (HTTP 401; not "
            "shown) — fix: correct the login in HF_ENDPOINT's address"
        )
        code, wants = await run_doctor(box_env(tmp_path, HF_ENDPOINT=mirror.url, **home))
        assert code == 1 and line(wants, "hub").startswith(
            f"fail hub: {mirror.url} wants a login (HTTP 401); no HF_TOKEN is set"
        )
        for output in (up, refused, wants):
            assert MIRROR_PASSWORD not in output and "not-it" not in output and HF_TOKEN not in output
    finally:
        mirror.stop()


async def test_a_closed_network_is_a_warning_a_service_can_start_on(tmp_path):
    """No way out (a network namespace of its own: loopback only) and no mirror configured: the
    hub check failed, so `goaltender doctor` exited 1 and could not gate a service's start."""
    user_home = tmp_path / "user"
    user_home.mkdir()
    env = box_env(
        user_home,
        GOALTENDER_HOME=str(tmp_path / "home"),
        GOALTENDER_MIN_FREE_MB="64",
        GOALTENDER_GYM_VENV=str(tmp_path / "no-gym-venv"),
    )
    closed = ["bwrap", "--dev-bind", "/", "/", "--unshare-net", "--", GOALTENDER, "doctor", "--json"]

    def doctor_offline(*args: str) -> tuple[int, list[dict]]:
        done = subprocess.run([*closed, *args], env=env, capture_output=True, text=True, timeout=120)
        return done.returncode, json.loads(done.stdout)

    code, findings = doctor_offline()
    [hub] = [f for f in findings if f["name"] == "hub"]
    assert hub["status"] == "warn" and hub["detail"].startswith(
        "no way out to https://huggingface.co from this box ("
    )
    assert "goals fetch only what is cached; no HF_TOKEN" in hub["detail"]
    assert "HF_HUB_OFFLINE=1" in hub["fix"] and "HF_ENDPOINT" in hub["fix"]
    assert [f for f in findings if f["status"] == "fail"] == [] and code == 0
    strict, _ = doctor_offline("--strict")  # a warning fails it
    assert strict == 1


def test_a_mirror_out_of_reach_still_fails(tmp_path):
    box = make_box(tmp_path)
    dead = f"http://127.0.0.1:{dead_port()}"
    box.env = {**box.env, "HF_ENDPOINT": dead}
    assert doctor.check_hub(box).status == "fail"  # configured: not ready
    assert doctor.check_hub(make_box(tmp_path, default_hub=dead)).status == "warn"  # the hub's: offline


# ---- disk and caches ----


def test_disk_and_caches_on_two_filesystems(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    small = Path(os.path.realpath(shm)) / f"doctor-{os.getpid()}"
    small.mkdir()
    try:
        settings = RunnerSettings(home=tmp_path / "home", min_free_mb=1)
        env = box_env(small, HF_HOME=str(small / "hf"))
        box = Box(settings, env, user_home=small)
        disk = check_disk(box)
        assert disk.status == "ok" and f"HOME ({small}) is on another filesystem" in disk.detail
        caches = check_caches(box)
        assert caches.status == "warn" and caches.detail == (
            f"the box sets HF_HOME={small / 'hf'}: the hub cache {small / 'hf' / 'hub'} is on the small disk (HOME's)"
        )
        box = Box(settings, box_env(small, HF_HOME=str(tmp_path / "hf")), user_home=small)
        caches = check_caches(box)
        assert (
            caches.status == "ok"
            and f"the hub cache {tmp_path / 'hf' / 'hub'} as the box sets it" in caches.detail
        )
    finally:
        shutil.rmtree(small)


def test_a_cache_that_cannot_be_written_fails(tmp_path):
    box = make_box(tmp_path, box_env(tmp_path, HF_HUB_CACHE="/proc/goaltender-doctor-cache"))
    caches = check_caches(box)
    assert caches.status == "fail" and caches.detail == "not writable: /proc/goaltender-doctor-cache"


# ---- NeMo RL and Gym ----


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def nemo_rl_checkout(path: Path, tag: str) -> Path:
    (path / "examples").mkdir(parents=True)
    (path / "examples" / "run_sft.py").write_text("print('sft')\n")
    (path / "3rdparty" / "Gym-workspace" / "Gym").mkdir(parents=True)
    (path / "3rdparty" / "Gym-workspace" / "Gym" / "pyproject.toml").write_text("")
    git("init", "-q", cwd=path)
    git("add", ".", cwd=path)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "rl", cwd=path)
    git("tag", tag, cwd=path)
    return path


def test_nemo_rl_checkout_and_its_venv(tmp_path):
    checkout = nemo_rl_checkout(tmp_path / "RL", "v0.7.0")
    env = box_env(tmp_path, NEMO_RL_DIR=str(checkout), PATH="/usr/bin:/bin")
    found = check_nemo_rl(make_box(tmp_path, env))
    assert found.status == "ok" and found.detail.startswith(f"{checkout} at v0.7.0")

    venv = check_nemo_rl_venv(make_box(tmp_path, env))
    assert venv.status == "warn" and "uv is not on PATH" in venv.detail

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "uv").write_text("#!/bin/sh\necho 'uv 0.9.5'\n")
    (tools / "uv").chmod(0o755)
    env["PATH"] = f"{tools}:/usr/bin:/bin"
    venv = check_nemo_rl_venv(make_box(tmp_path, env))
    assert venv.status == "warn" and "no venv in" in venv.detail and f"cd {checkout} && uv sync" in venv.fix
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").symlink_to(sys.executable)
    venv = check_nemo_rl_venv(make_box(tmp_path, env))
    assert venv.status == "warn" and "has no nemo-rl installed" in venv.detail and "uv sync" in venv.fix
    shutil.rmtree(checkout / ".venv")
    fake_venv(checkout / ".venv", sys.executable, "nemo_rl", "0.7.0")
    venv = check_nemo_rl_venv(make_box(tmp_path, env))
    assert venv.status == "ok", venv
    assert venv.detail.startswith(f"uv 0.9.5; nemo-rl 0.7.0 in {checkout / '.venv'} (Python 3.")
    assert venv.detail.endswith("worker venvs in each goal's cache (built on its first run)")

    older = nemo_rl_checkout(tmp_path / "RL-old", "v0.6.0")
    found = check_nemo_rl(make_box(tmp_path, box_env(tmp_path, NEMO_RL_DIR=str(older))))
    assert found.status == "warn" and "pairing is v0.7.0" in found.detail and "checkout v0.7.0" in found.fix

    missing = check_nemo_rl(make_box(tmp_path, box_env(tmp_path, NEMO_RL_DIR=str(tmp_path / "nope"))))
    assert missing.status == "warn" and "does not exist" in missing.detail and "git clone" in missing.fix


def fake_venv(path: Path, python: str, module: str, version: str) -> Path:
    """A real venv of `python` holding a stand-in package `module` of `version`."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True, capture_output=True)
    site = next(path.glob("lib/python3.*/site-packages"))
    (site / module).mkdir()
    (site / module / "__init__.py").write_text("")
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    name = module.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


def python312() -> str:
    """A Python 3.12, found as environments/star_count/gym_venv.sh finds one (pyenv's shim for it
    may refuse to run when 3.12 is not the selected version)."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [
        os.environ.get("GYM_PYTHON"),
        *map(str, sorted(root.glob("versions/3.12.*/bin/python3.12"))),
    ]
    for found in [*candidates, shutil.which("python3.12")]:
        if found and subprocess.run([found, "-V"], capture_output=True).returncode == 0:
            return found
    pytest.skip("no Python 3.12 on this machine")


def test_nemo_gym_venv(tmp_path):
    good = fake_venv(tmp_path / "gym", python312(), "nemo_gym", "0.4.0")
    found = check_nemo_gym(make_box(tmp_path, box_env(tmp_path, GOALTENDER_GYM_VENV=str(good))))
    assert found.status == "ok" and found.detail.startswith("nemo-gym 0.4.0 on Python 3.12.")

    newer = fake_venv(tmp_path / "gym-new", python312(), "nemo_gym", "0.5.0")
    found = check_nemo_gym(make_box(tmp_path, box_env(tmp_path, GOALTENDER_GYM_VENV=str(newer))))
    assert found.status == "warn" and "pairs with 0.4.0" in found.detail

    old = fake_venv(tmp_path / "gym-311", sys.executable, "nemo_gym", "0.4.0")  # this Python is 3.11
    found = check_nemo_gym(make_box(tmp_path, box_env(tmp_path, GOALTENDER_GYM_VENV=str(old))))
    assert found.status == "fail" and "needs Python 3.12+" in found.detail

    empty = tmp_path / "gym-empty"
    subprocess.run([python312(), "-m", "venv", "--without-pip", str(empty)], check=True)
    found = check_nemo_gym(make_box(tmp_path, box_env(tmp_path, GOALTENDER_GYM_VENV=str(empty))))
    assert found.status == "fail" and "import nemo_gym fails (ModuleNotFoundError" in found.detail


# ---- runner, sandbox, SSH, a broken check ----


def test_runner_and_sandbox_checks(tmp_path, monkeypatch):
    box = make_box(tmp_path)
    sandbox = check_sandbox(box)
    assert (
        sandbox.status == "ok" and "each goal's network is its own, out through slirp4netns" in sandbox.detail
    )
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("bwrap", "nsenter"):
        (tools / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tools))
    no_way_out = check_sandbox(make_box(tmp_path))
    assert no_way_out.status == "fail" and no_way_out.fix.startswith(
        "install slirp4netns (apt install slirp4netns)"
    )
    monkeypatch.undo()
    assert check_runner(box).status == "warn"
    box.settings.socket_path.write_text("not a socket")
    stale = check_runner(box)
    assert stale.status == "fail" and "goaltender runner" in stale.fix
    unsafe = check_sandbox(Box(RunnerSettings(home=tmp_path / "h", sandbox="none"), {}))
    assert unsafe.status == "warn" and "unsandboxed" in unsafe.detail
    planned = check_limits(box)  # no runner: what one started from here would find
    assert planned.detail.startswith("a runner started here would ")
    assert ("hold each goal to 8192 processes" in planned.detail) == (planned.status == "ok"), planned


def test_a_tun_device_the_runners_user_cannot_open_is_a_fail_naming_both_fixes(tmp_path, monkeypatch):
    # Found on a day-one walkthrough: in a container /dev/net/tun was root's alone, doctor said
    # `ok sandbox`, and the first goal failed at once (slirp4netns failed: open("/dev/net/tun")).
    monkeypatch.setattr(doctor, "TUN_DEVICE", tmp_path / "no-tun")
    found = check_sandbox(make_box(tmp_path))
    assert found.status == "fail", found
    assert f"cannot open {tmp_path / 'no-tun'} (No such file or directory)" in found.detail
    assert "chmod 666" in found.fix and "GOALTENDER_SANDBOX_NETWORK=none" in found.fix
    no_network = Box(RunnerSettings(home=tmp_path / "h", sandbox_network="none"), {})
    assert check_sandbox(no_network).status == "ok"  # no slirp4netns, no TUN device needed


def test_a_runner_stopped_for_its_lost_database_is_a_fail_saying_so(tmp_path):
    box = make_box(tmp_path)
    box.settings.home.mkdir(parents=True, exist_ok=True)
    box.settings.lost_marker.write_text("/h/runner.db was removed while the runner ran; … then remove it\n")
    found = check_runner(box)
    assert found.status == "fail"
    assert (
        found.detail
        == "not running: it stopped because /h/runner.db was removed while the runner ran; … then remove it"
    )


async def test_ssh_check_reads_the_banner(tmp_path):
    async def sshd(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6p1 Fake\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(sshd, "localhost", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        found = await asyncio.to_thread(check_ssh, make_box(tmp_path, ssh_port=port))
    finally:
        server.close()
        await server.wait_closed()
    assert (
        found.status == "ok"
        and f"sshd answers on localhost:{port} (SSH-2.0-OpenSSH_9.6p1 Fake)" in found.detail
    )
    assert '"remote_socket": ' in found.snippet and "GOALTENDER_RUNNERS=" in found.snippet
    closed = check_ssh(make_box(tmp_path, ssh_port=dead_port()))
    assert closed.status == "warn" and "goaltender bot --check" in closed.fix


def test_a_check_that_breaks_is_a_fail_line_and_output_is_redacted(tmp_path):
    def broken(box: Box):
        raise ValueError(f"boom with {OPENAI_KEY}")

    box = make_box(tmp_path, box_env(tmp_path, OPENAI_API_KEY=OPENAI_KEY))
    [finding] = run_checks(box, {"broken": broken})
    assert finding.status == "fail" and "the check itself failed: ValueError: boom" in finding.detail
    assert OPENAI_KEY not in finding.text()
