"""`goaltender fetch`: the real huggingface_hub client against a fake hub on 127.0.0.1 (no network),
through the real CLI — on an operator's shell, and from a goal's agent, whose fetch is recorded
in the goal's ledger and whose big downloads report milestones. Failures say why in one line;
the token never shows."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import http.server
import io
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path
from types import SimpleNamespace

import httpx2
import psutil
import pytest
from fake_hub import FakeHub
from fake_openai import ToolCall, Turn, finished
from helpers import BIN, events_until_report, eventually, submit, write_agent
from hypothesis import example, given, settings
from hypothesis import strategies as st

from goaltender.agents.policy import classify_command
from goaltender.bot.thread import WRITES, EventInThread
from goaltender.cli import build_parser
from goaltender.display.terminal import ConsoleThread
from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.protocol.fetch_spec import FetchSpec, spec_problem
from goaltender.runner.fetches import MAX_GOAL_DOWNLOADS, MAX_GOAL_FETCHES, download_command
from goaltender.runner.trust import user_name
from goaltender.storage.records import Event, HubFetch, HubFetched, MilestoneReported, PostsFolded, utcnow

TOKEN = "hf_PlantedFetchToken0123456789abcdef"  # valid, may read org/private (not org/gated)
GATED_TOKEN = "hf_PlantedGatedToken0123456789abcdef"  # valid, may read org/gated too
SHARD = 2_000_000  # two shards make a 4 MB model: "big" with GOALTENDER_FETCH_MILESTONE_MB=1


@pytest.fixture
def hub():
    rng = random.Random(7)
    fake = FakeHub()
    fake.add_repo(
        "org/tiny",
        {
            "config.json": b'{"hidden": 64}',
            "model-00001-of-00002.safetensors": rng.randbytes(SHARD),
            "model-00002-of-00002.safetensors": rng.randbytes(SHARD),
            "docs/README.md": b"# tiny\n",
        },
    )
    fake.add_revision("org/tiny", "v1", {"config.json": b'{"hidden": 32}'})
    fake.add_repo(
        "org/data", {"train.jsonl": b'{"x": 1}\n', "test.jsonl": b'{"x": 2}\n'}, repo_type="dataset"
    )
    fake.add_repo("org/gated", {"weights.bin": b"w" * 100}, gated=True)
    fake.add_repo("org/private", {"weights.bin": b"p" * 100}, private=True)
    fake.tokens[TOKEN] = {"org/private"}
    fake.tokens[GATED_TOKEN] = {"org/private", "org/gated"}
    fake.start()
    yield fake
    fake.stop()


def commit(hub: FakeHub, repo: str, repo_type: str = "model", revision: str = "main") -> str:
    return hub.repos[(repo_type, repo)].revisions[revision]


def fetch(hub: FakeHub, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`goaltender fetch ARGS` as an operator on the box runs it (no goal), against the fake hub."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GOALTENDER_"))}
    base = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url, "GOALTENDER_FETCH_MILESTONE_MB": "1"}
    return subprocess.run(
        [f"{BIN}/goaltender", "fetch", *args],
        env=clean | base | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_failure(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 1, out
    assert out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr
    return out.stderr


# ---- an operator on the box: download and print ----


def test_a_model_and_a_data_set_are_fetched_into_the_cache(hub, tmp_path):
    out = fetch(hub, tmp_path, "org/tiny")
    assert out.returncode == 0, out.stderr
    path, summary = out.stdout.splitlines()
    main = commit(hub, "org/tiny")
    assert path == str(tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / main)
    assert (Path(path) / "config.json").read_bytes() == b'{"hidden": 64}'
    assert (Path(path) / "docs" / "README.md").is_file()
    assert summary == f"model org/tiny (main, commit {main}): 4 files, 4.0 MB, 4.0 MB downloaded"
    # Over the threshold: the start and each quarter, once each, in order (on stderr, no goal).
    assert out.stderr.splitlines() == [
        f"goaltender: Downloading model org/tiny (4.0 MB): 4 files at main from {hub.url} into "
        f"{tmp_path / 'hf' / 'hub'}",
        "goaltender: Downloading model org/tiny: 25% of 4.0 MB",
        "goaltender: Downloading model org/tiny: 50% of 4.0 MB",
        "goaltender: Downloading model org/tiny: 75% of 4.0 MB",
    ]
    assert hub.count("GET", "/resolve/") == 4  # each file once, over plain HTTP

    again = fetch(hub, tmp_path, "org/tiny")
    assert again.returncode == 0 and again.stderr == ""  # nothing to download: no progress
    assert again.stdout.splitlines()[1].endswith("4 files, 4.0 MB, all from the cache")
    assert hub.count("GET", "/resolve/") == 4

    data = fetch(hub, tmp_path, "org/data", "--type", "dataset")
    assert data.returncode == 0, data.stderr
    path, summary = data.stdout.splitlines()
    assert "/datasets--org--data/snapshots/" in path and sorted(os.listdir(path)) == [
        "test.jsonl",
        "train.jsonl",
    ]
    assert summary.startswith(
        f"dataset org/data (main, commit {commit(hub, 'org/data', 'dataset')}): 2 files"
    )


def test_a_revision_and_include_patterns(hub, tmp_path):
    v1 = fetch(hub, tmp_path, "org/tiny", "--revision", "v1")
    assert v1.returncode == 0, v1.stderr
    path, summary = v1.stdout.splitlines()
    assert Path(path).name == commit(hub, "org/tiny", revision="v1") != commit(hub, "org/tiny")
    assert summary.startswith(f"model org/tiny (v1, commit {Path(path).name}): 1 file, 14 B")

    only = fetch(hub, tmp_path, "org/tiny", "--include", "*.json", "docs/*")
    assert only.returncode == 0, only.stderr
    path, summary = only.stdout.splitlines()
    assert sorted(p.name for p in Path(path).rglob("*") if p.is_file()) == ["README.md", "config.json"]
    assert "2 files, 21 B" in summary and only.stderr == ""  # small: no progress milestones
    assert hub.count("GET", ".safetensors") == 0

    by_commit = fetch(hub, tmp_path, "org/tiny", "--revision", Path(path).name, "--include", "*.json")
    assert by_commit.returncode == 0, by_commit.stderr
    assert f"(commit {Path(path).name})" in by_commit.stdout  # a commit asked for is not repeated


def test_offline_uses_a_warm_cache_and_says_so_of_a_cold_one(hub, tmp_path):
    assert fetch(hub, tmp_path, "org/tiny").returncode == 0
    asked = len(hub.requests)

    warm = fetch(hub, tmp_path, "org/tiny", HF_HUB_OFFLINE="1")
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.splitlines()[1] == (
        f"model org/tiny (main, commit {commit(hub, 'org/tiny')}): 4 files, 4.0 MB, all from the cache"
    )
    cold = fetch(hub, tmp_path, "org/data", "--type", "dataset", HF_HUB_OFFLINE="1")
    assert one_line_failure(cold) == (
        f"goaltender: HF_HUB_OFFLINE is set and dataset org/data is not in the cache ({tmp_path / 'hf' / 'hub'}): "
        "fetch it once where the hub is reachable, or unset HF_HUB_OFFLINE\n"
    )
    assert len(hub.requests) == asked  # offline means offline

    # The hub unreachable (not offline): a cached snapshot still serves, a missing one says why.
    closed = _closed_port()
    assert fetch(hub, tmp_path, "org/tiny", HF_ENDPOINT=f"http://127.0.0.1:{closed}").returncode == 0
    unreachable = fetch(
        hub, tmp_path, "org/data", "--type", "dataset", HF_ENDPOINT=f"http://127.0.0.1:{closed}"
    )
    assert one_line_failure(unreachable) == (
        f"goaltender: dataset org/data is not in the cache ({tmp_path / 'hf' / 'hub'}) and the hub at "
        f"http://127.0.0.1:{closed} (HF_ENDPOINT) cannot be reached: ConnectError: [Errno 111] Connection refused\n"
    )


def test_a_hub_that_is_down_says_so(hub, tmp_path):
    hub.down = 503
    out = fetch(hub, tmp_path, "org/tiny")
    assert one_line_failure(out) == (
        f"goaltender: {hub.url} failed (HTTP 503: down for maintenance) on GET "
        "/api/models/org/tiny/revision/main while fetching model org/tiny; try again later\n"
    )


TINY_FILES = [
    "config.json",
    "docs/README.md",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
]


def test_a_server_error_on_the_files_is_one_line_after_a_few_tries(hub, tmp_path):
    """The hub's API answers, its file store does not (HEAD and GET …/resolve/ answer 503): the
    library alone retried each file 5 times over 24 s and printed 34 lines."""
    from goaltender.runner.hub import SERVER_ERROR_TRIES

    hub.files_down = 503
    out = fetch(hub, tmp_path, "org/tiny")
    said = one_line_failure(out)
    prefix = f"goaltender: {hub.url} failed (HTTP 503: storage backend unavailable) on file "
    suffix = " while fetching model org/tiny; try again later\n"
    assert said.startswith(prefix) and said.endswith(suffix), said
    assert said.removeprefix(prefix).removesuffix(suffix) in TINY_FILES
    tries = collections.Counter(seen.path for seen in hub.requests if "/resolve/" in seen.path)
    assert tries and max(tries.values()) <= SERVER_ERROR_TRIES, tries  # the library alone: 6 each
    assert not (tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots").exists()

    # The library's lines come back on request (HF_HUB_VERBOSITY), still bounded.
    verbose = fetch(hub, tmp_path, "org/tiny", HF_HUB_VERBOSITY="warning")
    assert verbose.returncode == 1 and "HTTP Error 503 thrown while requesting HEAD" in verbose.stderr
    assert verbose.stderr.endswith(suffix)


def test_a_mirror_s_own_login_is_not_blamed_on_hf_token(hub, tmp_path):
    """A mirror behind a proxy's basic auth answers 401 before the hub sees the request: the
    fetch said the token in HF_TOKEN was refused, whether one was set or not."""
    hub.login = ("ana", MIRROR_PASSWORD)
    refused = (
        f"goaltender: {hub.url} (HF_ENDPOINT) refused the request for model org/tiny (HTTP 401, asking "
        "for a Basic login) with {sent}: give it the login it wants, as user:password@ in HF_ENDPOINT's "
        "address or a token in HF_TOKEN\n"
    )
    none = fetch(hub, tmp_path, "org/tiny")
    assert one_line_failure(none) == refused.format(
        sent="no credentials (HF_TOKEN is not set, HF_ENDPOINT's address has no user:password@)"
    )
    token = fetch(hub, tmp_path, "org/tiny", HF_TOKEN=TOKEN)
    assert one_line_failure(token) == refused.format(sent="the token in HF_TOKEN (not shown)")
    wrong = fetch(hub, tmp_path, "org/tiny", HF_ENDPOINT=hub.url.replace("http://", "http://ana:nope-nope@"))
    assert one_line_failure(wrong) == refused.format(
        sent="the user:password@ in HF_ENDPOINT's address (not shown)"
    )
    right = fetch(
        hub, tmp_path, "org/tiny", HF_ENDPOINT=hub.url.replace("http://", f"http://ana:{MIRROR_PASSWORD}@")
    )
    assert right.returncode == 0, right.stderr
    for out in (none, token, wrong, right):
        printed = out.stdout + out.stderr
        assert "hf_" not in printed and MIRROR_PASSWORD not in printed and "nope-nope" not in printed


def test_an_https_mirror_s_login_is_not_taken_for_a_missing_repo():
    """On an https address huggingface_hub reads any 401 of the API as "repository not found"
    (the fake hub is http): a 401 without the hub's X-Error-Code is the mirror's own."""
    from huggingface_hub.utils import hf_raise_for_status

    from goaltender.runner import hub

    url = "https://mirror.example/api/models/org/tiny/revision/main"
    request = httpx2.Request("GET", url)
    page = httpx2.Response(
        401, request=request, headers={"WWW-Authenticate": 'Basic realm="m"'}, text="<html>401</html>"
    )
    with pytest.raises(hub.HfHubHTTPError) as raised:
        hf_raise_for_status(page)
    assert type(raised.value).__name__ == "RepositoryNotFoundError"
    said = hub.explain(raised.value, hub.FetchSpec("org/tiny"))
    assert (
        said is not None
        and "refused the request for model org/tiny (HTTP 401, asking for a Basic login)" in said
    )
    # The hub's own answer for a private or missing repo stays what it is.
    missing = httpx2.Response(401, request=request, headers={"X-Error-Code": "RepoNotFound"}, json={})
    with pytest.raises(hub.HfHubHTTPError) as raised:
        hf_raise_for_status(missing)
    assert hub.explain(raised.value, hub.FetchSpec("org/tiny")).startswith("no model org/tiny on ")


def test_include_patterns_that_match_nothing_fail_naming_what_is_there(hub, tmp_path):
    """It exited 0 and printed a snapshot path that did not exist."""
    out = fetch(hub, tmp_path, "org/tiny", "--include", "*.gguf", "weights/*")
    assert one_line_failure(out) == (
        "goaltender: no file of model org/tiny (main) matches --include '*.gguf' 'weights/*': it holds "
        f"4 files: {', '.join(TINY_FILES)}\n"
    )
    assert hub.count("GET", "/resolve/") == 0
    # Offline, from what the cache holds.
    assert fetch(hub, tmp_path, "org/tiny", "--include", "*.json").returncode == 0
    cached = fetch(hub, tmp_path, "org/tiny", "--include", "*.gguf", HF_HUB_OFFLINE="1")
    assert one_line_failure(cached) == (
        "goaltender: no file of model org/tiny (main) matches --include '*.gguf': its cached snapshot "
        "holds 1 file: config.json\n"
    )


@pytest.mark.parametrize(
    ("args", "env", "why"),
    [
        (
            ["org/gated"],
            {},
            "model org/gated is gated: it needs a token, in HF_TOKEN, of an account that accepted its "
            "terms at {url}/org/gated; HF_TOKEN is not set",
        ),
        (
            ["org/gated"],
            {"HF_TOKEN": TOKEN},
            "model org/gated is gated: the account whose token is in HF_TOKEN has no access yet: accept "
            "its terms at {url}/org/gated",
        ),
        (
            ["org/private"],
            {},
            "no model org/private on {url} (check the name; is it a dataset? use --type dataset; if it "
            "is private, it needs a token with access in HF_TOKEN, which is not set)",
        ),
        (
            ["org/tiny"],
            {"HF_TOKEN": "hf_NotAValidToken0123456789abcdef"},
            "{url} refused the token in HF_TOKEN (401: invalid or expired)",
        ),
        (
            ["org/nope", "--type", "dataset"],
            {"HF_TOKEN": TOKEN},
            "no dataset org/nope on {url} (check the name",
        ),
        (["org/tiny", "--revision", "v9"], {}, "model org/tiny has no revision 'v9' on {url}"),
    ],
    ids=["gated-no-token", "gated-no-access", "private-no-token", "bad-token", "not-found", "no-revision"],
)
def test_failures_say_why_in_one_line_and_never_show_the_token(hub, tmp_path, args, env, why):
    out = fetch(hub, tmp_path, *args, **env)
    assert one_line_failure(out).startswith("goaltender: " + why.format(url=hub.url)), out.stderr
    assert "hf_" not in out.stderr  # neither the token nor a piece of it
    assert not (tmp_path / "hf" / "hub" / "models--org--gated" / "snapshots").exists()


MIRROR_PASSWORD = "Pl4nted-mirror-pass"


def test_a_mirror_s_password_is_never_printed(hub, tmp_path):
    """HF_ENDPOINT with user:password@ (a mirror behind basic auth): huggingface_hub's retry lines
    (shown with HF_HUB_VERBOSITY) and its errors quote the URL they asked, and `goaltender fetch`
    printed them as they were."""
    with_password = hub.url.replace("http://", f"http://ana:{MIRROR_PASSWORD}@")
    hub.busy = 2  # two downloads answered 429 and retried: the library says so, with the URL
    out = fetch(hub, tmp_path, "org/tiny", HF_ENDPOINT=with_password, HF_HUB_VERBOSITY="warning")
    hub.down = 429  # and a failure that quotes the URL in its one line
    failed = fetch(hub, tmp_path, "org/data", "--type", "dataset", HF_ENDPOINT=with_password)
    for printed in (out.stdout + out.stderr, failed.stderr):
        assert MIRROR_PASSWORD not in printed and "ana:" not in printed, printed
    assert out.returncode == 0, out.stderr
    retried = f"HTTP Error 429 thrown while requesting GET {hub.url.replace('http://', 'http://[redacted]@')}/org/tiny/"
    assert retried in out.stderr
    assert one_line_failure(failed).startswith(
        f"goaltender: {hub.url} answered HTTP 429 for dataset org/data: "
    )


def test_a_token_with_access_fetches_gated_and_private_repos(hub, tmp_path):
    for repo in ("org/gated", "org/private"):
        out = fetch(hub, tmp_path, repo, HF_TOKEN=GATED_TOKEN)
        assert out.returncode == 0, out.stderr
        assert (Path(out.stdout.splitlines()[0]) / "weights.bin").stat().st_size == 100
        assert GATED_TOKEN not in out.stdout + out.stderr
    assert all(seen.with_token for seen in hub.requests)


def test_usage_errors_exit_2(hub, tmp_path):
    bad_id = fetch(hub, tmp_path, "not//a/repo")
    assert bad_id.returncode == 2 and "not a repo id: 'not//a/repo'" in bad_id.stderr
    bad_size = fetch(hub, tmp_path, "org/tiny", GOALTENDER_FETCH_MILESTONE_MB="lots")
    assert bad_size.returncode == 2 and "GOALTENDER_FETCH_MILESTONE_MB is not a size in MB" in bad_size.stderr
    assert hub.requests == []


def test_a_download_the_disk_has_no_room_for_is_refused_before_it_starts(hub, tmp_path):
    # The real CLI, with the disk probe reporting 1 MB free (no small filesystem needed).
    script = (
        "import sys\n"
        "from goaltender.runner import hub\n"
        "from goaltender.storage.space import FreeSpace\n"
        "hub.free_space = lambda path: FreeSpace(path, 1_000_000)\n"
        "from goaltender import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GOALTENDER_"))}
    out = subprocess.run(
        [sys.executable, "-c", script, "fetch", "org/tiny"],
        env=env | {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert one_line_failure(out) == (
        f"goaltender: disk full: model org/tiny needs 4.0 MB more in {tmp_path / 'hf' / 'hub'}, which has "
        "1.0 MB free; make room, or fetch fewer files with --include\n"
    )
    assert hub.count("GET", "/resolve/") == 0


def test_the_runners_download_keeps_its_reserve_free(hub, tmp_path):
    """The download the runner starts for a goal (`--json`) also keeps the runner's
    GOALTENDER_MIN_FREE_MB (`--keep-free`) free; what is cached already needs no room."""
    script = (
        "import sys\n"
        "from goaltender.runner import hub\n"
        "from goaltender.storage.space import FreeSpace\n"
        "hub.free_space = lambda path: FreeSpace(path, 4_500_000)\n"
        "from goaltender import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GOALTENDER_"))}
    env |= {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": hub.url}

    def download(repo: str, keep_free: int) -> tuple[int, list[dict]]:
        kind = "dataset" if repo == "org/data" else "model"
        argv = ["fetch", "--json", f"--keep-free={keep_free}", f"--type={kind}", "--", repo]
        done = subprocess.run(
            [sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True, timeout=120
        )
        return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]

    assert download("org/tiny", 1_000_000) == (
        1,
        [
            {
                "failed": f"disk full: model org/tiny needs 4.0 MB more in {tmp_path / 'hub'}, which has "
                "4.5 MB free and keeps 1.0 MB free (GOALTENDER_MIN_FREE_MB); make room, or fetch fewer "
                "files with --include"
            }
        ],
    )
    assert hub.count("GET", "/resolve/") == 0
    code, [fetched] = download("org/data", 0)  # nothing kept: room enough
    assert code == 0 and fetched["fetched"]["repo"] == "org/data"
    code, [again] = download("org/data", 10**12)  # cached: nothing to write, nothing refused
    assert code == 0 and again["fetched"]["downloaded_bytes"] == 0


def test_a_full_disk_mid_download_is_named():
    from goaltender.runner import hub

    spec = hub.FetchSpec("org/tiny")
    said = hub.explain(OSError(errno.ENOSPC, "No space left on device"), spec)
    assert said is not None and said.startswith("disk full while fetching model org/tiny: ")
    assert hub.explain(ValueError("a bug"), spec) is None  # not a failure it knows: raised as is


# ---- from a goal: recorded in its ledger, milestones for big downloads ----

AGENT = """
goaltender fetch org/tiny > fetch.out 2> fetch.err
echo "tiny rc=$?" >> rc.out
goaltender fetch org/data --type dataset >> fetch.out 2>> fetch.err
echo "data rc=$?" >> rc.out
goaltender fetch org/gated >> fetch.out 2>> fetch.err
echo "gated rc=$?" >> rc.out
"""


def runner_environment(monkeypatch, hub: FakeHub) -> None:
    """What the box gives the runner, and the runner its goals: the hub's address, a token."""
    for var in [v for v in os.environ if v.startswith("HF_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # granted to goals by default; no access to org/gated
    monkeypatch.setenv("GOALTENDER_FETCH_MILESTONE_MB", "1")


async def test_a_goal_records_what_its_agent_fetched(hub, start_runner, connect, tmp_path, monkeypatch):
    runner_environment(monkeypatch, hub)
    runner = await start_runner(agents={"a": write_agent(tmp_path, "agent.sh", AGENT)})
    client = await connect(runner)
    goal_id = await submit(client, "fetch a model and its data, max 1 experiments", agent="a")
    events = await events_until_report(client, goal_id)

    workspace = Path((await runner.store.get_goal(goal_id)).workspace)
    assert (workspace / "rc.out").read_text().split() == ["tiny", "rc=0", "data", "rc=0", "gated", "rc=1"]
    milestones = [e.data.title for e in events if e.data.kind == "milestone"]
    assert milestones == [
        "Downloading model org/tiny (4.0 MB)",
        "Downloading model org/tiny: 25% of 4.0 MB",
        "Downloading model org/tiny: 50% of 4.0 MB",
        "Downloading model org/tiny: 75% of 4.0 MB",
    ]
    fetched = [e.data.fetch for e in events if isinstance(e.data, HubFetched)]
    cache = runner.settings.cache_dir / "huggingface" / "hub"  # HF_HOME as the runner routes it
    tiny, data = fetched
    assert (tiny.repo, tiny.repo_type, tiny.revision, tiny.commit) == (
        "org/tiny",
        "model",
        "main",
        commit(hub, "org/tiny"),
    )
    assert tiny.path == str(cache / "models--org--tiny" / "snapshots" / tiny.commit)
    assert (tiny.files, tiny.bytes, tiny.downloaded_bytes) == (4, 2 * SHARD + 21, 2 * SHARD + 21)
    assert (data.repo, data.repo_type, data.commit) == (
        "org/data",
        "dataset",
        commit(hub, "org/data", "dataset"),
    )
    out = (workspace / "fetch.out").read_text().splitlines()
    assert out[0] == tiny.path and out[2] == data.path
    assert out[1].endswith(f"recorded in goal #{goal_id}'s ledger (event {_seq_of(events, tiny)})")
    assert "the account whose token is in HF_TOKEN has no access yet" in (workspace / "fetch.err").read_text()
    assert any(seen.with_token for seen in hub.requests)  # the granted token was used

    summary = await client.request(p.Summary(goal_id=goal_id))
    assert "## From the hub" in summary.text
    assert (
        f"- model org/tiny (main, commit {tiny.commit}): 4 files, 4.0 MB, 4.0 MB downloaded — `{tiny.path}`"
        in (summary.text)
    )
    assert f"dataset org/data (main, commit {data.commit})" in events[-1].data.text  # the final report
    everything = "".join(e.model_dump_json() for e in events) + summary.text
    everything += (
        "".join(f.read_text() for f in workspace.glob("*.out")) + (workspace / "fetch.err").read_text()
    )
    assert TOKEN not in everything and TOKEN[3:12] not in everything


async def test_a_goals_fetches_past_its_rate_are_folded_and_kept(
    hub, start_runner, connect, tmp_path, monkeypatch
):
    """A fetch's milestones and its record are posts the agent's request makes: past the goal's
    rate (runner/folding.py) they are folded like its own milestones, the agent is told so, and
    the record is still the goal's ledger of fetches (its final report lists it)."""
    runner_environment(monkeypatch, hub)
    agent = write_agent(tmp_path, "agent.sh", "goaltender fetch org/tiny > fetch.out 2> fetch.err\n")
    runner = await start_runner(agents={"a": agent}, milestone_burst=2, milestones_per_minute=0.001)
    client = await connect(runner)
    goal_id = await submit(client, "fetch a model, max 1 experiments", agent="a")
    events = await events_until_report(client, goal_id)

    workspace = Path((await runner.store.get_goal(goal_id)).workspace)
    assert "; folded: goal #" in (workspace / "fetch.out").read_text()
    posts = [e.data for e in events if isinstance(e.data, MilestoneReported | HubFetched)]
    assert [getattr(d, "title", "record") for d in posts if not d.folded] == [
        "Downloading model org/tiny (4.0 MB)",
        "Downloading model org/tiny: 25% of 4.0 MB",
    ]
    [fold] = [e.data for e in events if isinstance(e.data, PostsFolded)]  # shown before the report
    assert (fold.milestones, fold.fetches) == (2, 1)
    assert fold.titles[-1] == "fetched model org/tiny (main)"
    [fetched] = await runner.store.hub_fetches(goal_id)
    assert (
        fetched.repo == "org/tiny"
        and f"model org/tiny (main, commit {fetched.commit})" in events[-1].data.text
    )


async def test_the_built_in_agent_fetches_with_its_tool(
    hub, start_runner, connect, model_server, monkeypatch
):
    runner_environment(monkeypatch, hub)
    model = model_server
    call = {"repo": "org/data", "repo_type": "dataset", "include": ["train.*"]}
    model.add(Turn(tool_calls=[ToolCall("fetch_from_hub", call)]), finished("Fetched; nothing more to do."))
    runner = await start_runner(agents={"openai": [sys.executable, "-m", "goaltender.agents.openai_agent"]})
    client = await connect(runner)
    goal_id = await submit(client, "fetch the training split, max 1 experiments", agent="openai")
    events = await events_until_report(client, goal_id)
    [fetched] = [e.data.fetch for e in events if isinstance(e.data, HubFetched)]
    assert (fetched.repo, fetched.repo_type, fetched.files) == ("org/data", "dataset", 1)
    [result] = [m["content"] for m in model.requests[1].body["messages"] if m["role"] == "tool"]
    assert result.splitlines()[:2] == ["exit code 0", fetched.path]


# ---- the runner downloads for goals: the hub cache is theirs to read, not to write ----

SELF_SERVED = """
# The agent's own hub settings, none of which a goal's fetch may use: a dead hub, a token the hub
# refuses, a cache of its own.
export HF_ENDPOINT=http://127.0.0.1:{closed} HF_TOKEN=hf_TheAgentsOwnToken0123456789abc
export HF_HUB_CACHE="$PWD/own-cache" HF_HOME="$PWD/own-home" HF_HUB_OFFLINE=1
goaltender fetch org/private > private.out 2> private.err
echo $? > private.rc
"""


async def test_a_goals_fetch_is_the_runners_download(hub, start_runner, connect, tmp_path, monkeypatch):
    runner_environment(monkeypatch, hub)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "shared-hub"))  # the box's: where goals read
    agent = write_agent(tmp_path, "agent.sh", SELF_SERVED.format(closed=_closed_port()))
    runner = await start_runner(agents={"a": agent})
    assert runner.settings.hub_cache == tmp_path / "shared-hub"
    client = await connect(runner)
    goal_id = await submit(client, "fetch a private model, max 1 experiments", agent="a")
    events = await events_until_report(client, goal_id)

    workspace = Path((await runner.store.get_goal(goal_id)).workspace)
    said = (workspace / "private.err").read_text()
    assert (workspace / "private.rc").read_text().strip() == "0", said
    snapshot = tmp_path / "shared-hub" / "models--org--private" / "snapshots" / commit(hub, "org/private")
    path, summary = (workspace / "private.out").read_text().splitlines()
    assert path == str(snapshot) and (snapshot / "weights.bin").read_bytes() == b"p" * 100
    [fetched] = [e.data.fetch for e in events if isinstance(e.data, HubFetched)]
    assert fetched.path == path
    assert summary.endswith(f"recorded in goal #{goal_id}'s ledger (event {_seq_of(events, fetched)})")
    # The runner's hub, the runner's token (the agent's would have been refused), the runner's cache.
    assert hub.requests and all(seen.with_token for seen in hub.requests)
    assert not (workspace / "own-cache").exists() and not (workspace / "own-home").exists()


PLANTER = """
# A package named like the runner's, where the runner's download process might import it from.
for dir in "$GOALTENDER_CACHE_DIR" "$GOALTENDER_HOME/cache/goaltender" "$PWD/goaltender"; do
  mkdir -p "$dir" 2>/dev/null || continue
  printf 'import os\\nopen(os.path.expanduser("~/pwned-by-goal"), "a").close()\\n' > "$dir/__init__.py"
  printf 'open("pwned", "a").close()\\n' > "$dir/cli.py"
done
goaltender fetch org/tiny --include '*.json' > tiny.out 2> tiny.err
echo $? > tiny.rc
"""


async def test_the_runners_download_imports_no_code_a_goal_planted(
    hub, start_runner, connect, tmp_path, monkeypatch
):
    runner_environment(monkeypatch, hub)
    monkeypatch.setenv("HOME", str(tmp_path / "runner-user"))  # where the planted code would leave its mark
    (tmp_path / "runner-user").mkdir()
    runner = await start_runner(agents={"a": write_agent(tmp_path, "agent.sh", PLANTER)})
    client = await connect(runner)
    goal_id = await submit(client, "plant a package, then fetch, max 1 experiments", agent="a")
    await events_until_report(client, goal_id)

    workspace = Path((await runner.store.get_goal(goal_id)).workspace)
    assert (workspace / "tiny.rc").read_text().strip() == "0", (workspace / "tiny.err").read_text()
    planted = [
        Path(d) / "__init__.py" for d in (runner.settings.cache_dir / "goaltender", workspace / "goaltender")
    ]
    assert any(path.exists() for path in planted)  # the goal could write one of them ...
    assert not (tmp_path / "runner-user" / "pwned-by-goal").exists()  # ... and it never ran
    assert not list(runner.settings.home.rglob("pwned"))


async def test_the_runners_download_writes_through_no_link_out_of_the_cache(
    hub, start_runner, connect, tmp_path, monkeypatch
):
    """Links left in the hub cache while goals could write it (before it was read-only to them):
    the runner's download, which writes as the runner's user, refuses to follow them out."""
    runner_environment(monkeypatch, hub)
    runner = await start_runner(agents={"a": write_agent(tmp_path, "agent.sh", HELD)})
    outside = tmp_path / "outside"  # say the runner's ~/.ssh
    outside.mkdir()
    repo = runner.settings.hub_cache / "models--org--tiny"
    repo.mkdir(parents=True)
    (repo / "snapshots").symlink_to(outside)
    client = await connect(runner)
    goal_id = await submit(client, "fetch into a cache with a link out, max 1 experiments", agent="a")
    await events_until_report(client, goal_id)

    workspace = Path((await runner.store.get_goal(goal_id)).workspace)
    failed = subprocess.CompletedProcess(
        [],
        int((workspace / "tiny.rc").read_text()),
        (workspace / "tiny.out").read_text(),
        (workspace / "tiny.err").read_text(),
    )
    assert one_line_failure(failed) == (
        f"goaltender: the cache of model org/tiny holds a link out of {runner.settings.hub_cache} "
        f"({repo / 'snapshots'} -> {outside}); remove {repo} and fetch again\n"
    )
    assert list(outside.iterdir()) == [] and hub.count("GET", "/resolve/") == 0


GATED = """
goaltender fetch org/gated > gated.out 2> gated.err
echo $? > gated.rc
"""


async def test_the_runners_download_uses_its_own_login_never_a_token_file_goals_could_write(
    hub, start_runner, connect, tmp_path, monkeypatch
):
    runner_environment(monkeypatch, hub)
    monkeypatch.delenv(
        "HF_TOKEN"
    )  # no token in the environment: a login's file, as `hf auth login` leaves it
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "runner-user"))
    login = tmp_path / "runner-user" / ".cache" / "huggingface" / "token"
    login.parent.mkdir(parents=True)
    login.write_text(GATED_TOKEN)  # the runner's own: may read org/gated
    runner = await start_runner(agents={"a": write_agent(tmp_path, "agent.sh", GATED)})
    # Where the goals' HF_HOME was (read-write in their sandboxes): a token with no access to org/gated.
    (runner.settings.cache_dir / "huggingface").mkdir(parents=True, exist_ok=True)
    (runner.settings.cache_dir / "huggingface" / "token").write_text(TOKEN)
    client = await connect(runner)
    goal_id = await submit(client, "fetch a gated model, max 1 experiments", agent="a")
    await events_until_report(client, goal_id)

    workspace = Path((await runner.store.get_goal(goal_id)).workspace)
    assert (workspace / "gated.rc").read_text().strip() == "0", (workspace / "gated.err").read_text()
    assert (Path((workspace / "gated.out").read_text().splitlines()[0]) / "weights.bin").is_file()


UNGRANTED = """
if [ -n "${HF_TOKEN:-}" ]; then echo "the agent has HF_TOKEN" > token.out; fi
goaltender fetch org/private > private.out 2> private.err
echo $? > private.rc
goaltender fetch org/tiny --include '*.json' > tiny.out 2> tiny.err
echo $? > tiny.rc
"""


async def test_without_the_grant_the_runner_fetches_with_no_token(
    hub, start_runner, connect, tmp_path, monkeypatch
):
    runner_environment(monkeypatch, hub)  # HF_TOKEN is in the runner's environment ...
    agent = write_agent(tmp_path, "agent.sh", UNGRANTED)
    runner = await start_runner(agents={"a": agent}, grants=["OPENAI_API_KEY"])  # ... not granted
    # A token file where huggingface_hub would look (HF_HOME's), as a login or a goal may leave one.
    (runner.settings.cache_dir / "huggingface").mkdir(parents=True, exist_ok=True)
    (runner.settings.cache_dir / "huggingface" / "token").write_text(TOKEN)
    client = await connect(runner)
    goal_id = await submit(client, "fetch without a token, max 1 experiments", agent="a")
    events = await events_until_report(client, goal_id)

    workspace = Path((await runner.store.get_goal(goal_id)).workspace)
    assert not (workspace / "token.out").exists()
    failed = subprocess.CompletedProcess(
        [],
        int((workspace / "private.rc").read_text()),
        (workspace / "private.out").read_text(),
        (workspace / "private.err").read_text(),
    )
    assert one_line_failure(failed) == (
        f"goaltender: no model org/private on {hub.url} (check the name; is it a dataset? use --type "
        "dataset; if it is private, it needs a token with access in HF_TOKEN, which is not set)\n"
    )
    assert (workspace / "tiny.rc").read_text().strip() == "0", (workspace / "tiny.err").read_text()
    assert [e.data.fetch.repo for e in events if isinstance(e.data, HubFetched)] == ["org/tiny"]
    assert hub.requests and not any(seen.with_token for seen in hub.requests)


HELD = """
goaltender fetch org/tiny > tiny.out 2> tiny.err
echo $? > tiny.rc
"""


def downloads() -> list[psutil.Process]:
    """The runner's download processes (the runner runs in this test's process)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.cmdline()[1:6] == ["-P", "-m", "goaltender.cli", "fetch", "--json"]:
                found.append(child)
    return found


async def test_stopping_a_goal_kills_its_download(hub, start_runner, connect, tmp_path, monkeypatch):
    runner_environment(monkeypatch, hub)
    hub.hold()
    runner = await start_runner(agents={"a": write_agent(tmp_path, "agent.sh", HELD)})
    client = await connect(runner)
    goal_id = await submit(client, "fetch, then be stopped, max 1 experiments", agent="a")
    await eventually(lambda: hub.held)  # the runner's download is under way, mid-file
    [download] = await eventually(downloads)
    assert f"--keep-free={64 * 1000 * 1000}" in download.cmdline()  # the runner's GOALTENDER_MIN_FREE_MB

    async def milestones() -> list[str]:
        return [
            e.data.title
            for e in await runner.store.events_since(0, goal_id=goal_id)
            if e.data.kind == "milestone"
        ]

    assert await eventually(milestones) == ["Downloading model org/tiny (4.0 MB)"]
    stopped = await client.request(p.Stop(goal_id=goal_id, reason="enough"))
    assert "stopped" in stopped.message
    assert not download.is_running()  # killed (and reaped) before the stop was answered
    events = await events_until_report(client, goal_id)
    assert not [e for e in events if isinstance(e.data, HubFetched)]
    assert await milestones() == ["Downloading model org/tiny (4.0 MB)"]
    hub.release()


async def test_a_runner_shutting_down_kills_the_downloads(hub, start_runner, connect, tmp_path, monkeypatch):
    runner_environment(monkeypatch, hub)
    hub.hold()
    runner = await start_runner(agents={"a": write_agent(tmp_path, "agent.sh", HELD)})
    client = await connect(runner)
    await submit(client, "fetch, then the runner stops, max 1 experiments", agent="a")
    await eventually(lambda: hub.held)
    [download] = await eventually(downloads)
    await runner.close()
    assert not download.is_running()
    hub.release()


async def test_two_goals_fetching_one_repo_download_it_once(
    hub, start_runner, connect, tmp_path, monkeypatch
):
    runner_environment(monkeypatch, hub)
    hub.hold()
    runner = await start_runner(agents={"a": write_agent(tmp_path, "agent.sh", HELD)})
    client = await connect(runner)
    first = await submit(client, "fetch org/tiny first, max 1 experiments", agent="a")
    await eventually(lambda: hub.held)  # its download is under way
    second = await submit(client, "fetch org/tiny too, max 1 experiments", agent="a")
    # The second goal's fetch has reached the runner, and waits: only the first one's download holds it.
    await eventually(lambda: runner.campaigns.fetches.under_way(second) == (0, 1))
    hub.release()

    records = []
    for goal_id in (first, second):
        events = await events_until_report(await connect(runner), goal_id)
        workspace = Path((await runner.store.get_goal(goal_id)).workspace)
        assert (workspace / "tiny.rc").read_text().strip() == "0", (workspace / "tiny.err").read_text()
        [fetched] = [e.data.fetch for e in events if isinstance(e.data, HubFetched)]
        records.append(fetched)
    assert hub.count("GET", "/resolve/") == 4  # each file once
    assert records[0].path == records[1].path
    assert (records[0].downloaded_bytes, records[1].downloaded_bytes) == (2 * SHARD + 21, 0)


async def test_a_goals_fetches_are_bounded(hub, start_runner, connect, tmp_path, monkeypatch):
    """Through the goal's own socket, as its agent would: MAX_GOAL_DOWNLOADS download at once, up
    to MAX_GOAL_FETCHES wait their turn, and one more is refused in one line."""
    runner_environment(monkeypatch, hub)
    repos = [f"org/m{i}" for i in range(MAX_GOAL_FETCHES + 1)]
    for i, repo in enumerate(repos):
        hub.add_repo(repo, {"w.bin": bytes([i]) * 10})
    hub.hold()
    runner = await start_runner(agents={"idle": write_agent(tmp_path, "idle.sh", "sleep 120\n")})
    operator = await connect(runner)
    goal_id = await submit(operator, "a goal that fetches a lot, max 1 experiments", agent="idle")
    agents = [
        await RunnerClient.connect_unix(runner.settings.agent_socket(goal_id), client="agent")
        for _ in range(5)  # its in-flight requests: 8 a connection
    ]
    calls = [
        asyncio.ensure_future(agents[i % 5].request(p.Fetch(goal_id=goal_id, repo=repo)))
        for i, repo in enumerate(repos)
    ]
    try:
        done, _ = await asyncio.wait(calls, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        [refused] = [call.result() for call in done]
        assert refused.fetch is None and refused.failure.startswith(
            f"goal #{goal_id} has {MAX_GOAL_FETCHES} fetches under way, its most: fetch model org/m"
        )
        fetches = runner.campaigns.fetches
        busy = (MAX_GOAL_DOWNLOADS, MAX_GOAL_FETCHES - MAX_GOAL_DOWNLOADS)
        await eventually(lambda: hub.held == MAX_GOAL_DOWNLOADS and fetches.under_way(goal_id) == busy)
        assert len(downloads()) == MAX_GOAL_DOWNLOADS

        await operator.request(p.Stop(goal_id=goal_id))
        assert not downloads() and fetches.under_way(goal_id) == (0, 0)
    finally:
        for agent in agents:
            await agent.close()
        hub.release()
    # Every other fetch is answered: cancelled with its goal, in one line.
    operator_uid = f"uid {os.getuid()} ({user_name(os.getuid())})"
    cancelled = [call.result() for call in calls if call not in done]
    assert [reply.failure for reply in cancelled] == [
        f"the fetch of model {repo} was cancelled: goal #{goal_id} ended: stopped by {operator_uid}"
        for repo, call in zip(repos, calls, strict=True)
        if call not in done
    ]


async def test_a_fetch_the_runner_cannot_take_is_refused(hub, start_runner, connect, tmp_path, monkeypatch):
    runner_environment(monkeypatch, hub)
    runner = await start_runner(agents={"idle": write_agent(tmp_path, "idle.sh", "sleep 120\n")})
    client = await connect(runner)
    goal_id = await submit(client, "a goal to fetch for, max 1 experiments", agent="idle")
    for fields, said in [
        ({"repo": "org/tiny", "revision": "../../../../etc"}, "not a revision: '../../../../etc'"),
        ({"repo": "org/tiny", "revision": "/abs"}, "not a revision: '/abs'"),
        ({"repo": "--help"}, "not a repo id: '--help'"),
        ({"repo": "org/tiny", "include": ["ok", "a\nb"]}, "not a file pattern: 'a\\nb'"),
    ]:
        with pytest.raises(p.ProtocolError) as refused:
            await client.request(p.Fetch(goal_id=goal_id, **fields))
        assert refused.value.error.code == "bad_request" and said in refused.value.error.message
    assert hub.requests == []


@example(
    repo="org/x", revision="refs/pr/1", include=["--json", "-", "--", "--keep-free=1"], repo_type="model"
)
@example(repo="--json", revision=None, include=[], repo_type="model")
@example(repo="org/x", revision="-r", include=["a b", "*"], repo_type="dataset")
@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    repo=st.text(min_size=1, max_size=30),
    revision=st.none() | st.text(max_size=30),
    include=st.lists(st.text(max_size=20), max_size=4),
    repo_type=st.sampled_from(["model", "dataset"]),
)
def test_a_spec_reaches_the_download_as_it_was_asked(repo, revision, include, repo_type):
    """Whatever a goal's agent asks for: refused, or the download's own argument parser reads back
    exactly that spec (no value is taken for an option)."""
    spec = FetchSpec(repo, repo_type, revision, tuple(include))
    if spec_problem(spec) is not None:
        return
    argv = download_command(spec, keep_free=5)
    assert argv[:4] == [sys.executable, "-P", "-m", "goaltender.cli"]
    args = build_parser(only="fetch").parse_args(argv[4:])
    assert (args.repo, args.repo_type, args.revision, tuple(args.include)) == astuple(spec)
    assert (args.json, args.keep_free, args.goal_id) == (True, 5, None)


async def test_the_model_provider_never_gets_a_mirror_s_password(
    hub, start_runner, connect, model_server, monkeypatch
):
    """Inside a goal, the fetch tool's result (the library's retry lines quote the URL, in the
    runner's download) and a command's output (`printenv HF_ENDPOINT`, or the URL with its slashes escaped as JSON may
    write them) went to the model provider as they were."""
    runner_environment(monkeypatch, hub)
    monkeypatch.setenv("HF_ENDPOINT", hub.url.replace("http://", f"http://ana:{MIRROR_PASSWORD}@"))
    hub.busy = 2
    model = model_server
    model.add(
        Turn(
            tool_calls=[
                ToolCall("fetch_from_hub", {"repo": "org/tiny"}),
                ToolCall("shell", {"command": "printenv HF_ENDPOINT"}),
                ToolCall("shell", {"command": "printenv HF_ENDPOINT | sed 's|/|\\\\/|g'"}),
            ]
        ),
        finished("Fetched; nothing more to do."),
    )
    runner = await start_runner(agents={"openai": [sys.executable, "-m", "goaltender.agents.openai_agent"]})
    client = await connect(runner)
    goal_id = await submit(client, "fetch tiny, max 1 experiments", agent="openai")
    await events_until_report(client, goal_id)
    sent = json.dumps([r.body for r in model.requests])
    assert MIRROR_PASSWORD not in sent and "ana:" not in sent
    fetched, printed, escaped = [
        m["content"] for m in model.requests[1].body["messages"] if m["role"] == "tool"
    ]
    # The runner's download retried past the 429s (its lines quote the URL: redacted, and kept to
    # itself unless it fails); the agent's result is the path and the record.
    assert fetched.startswith("exit code 0") and "recorded in goal #" in fetched and hub.busy == 0
    assert printed == f"exit code 0\n{hub.url.replace('http://', 'http://[redacted]@')}\n"
    assert escaped == printed  # found as JSON reads it; the escapes it was found through go with it


def _seq_of(events, fetch: HubFetch) -> int:
    return next(e.seq for e in events if isinstance(e.data, HubFetched) and e.data.fetch == fetch)


def test_slack_and_the_console_show_a_fetch_and_the_policy_allows_it():
    fetch_record = HubFetch(
        repo="org/tiny",
        commit="4b3050eb5deba4f419a256fed4272dcd07ef5adf",
        path="/c",
        files=4,
        bytes=4_000_021,
    )
    [write] = WRITES[HubFetched](EventInThread("gpu-1", 3, 17), HubFetched(fetch=fetch_record))
    assert write.kind == "post"
    assert (
        "fetched model org/tiny (main, commit 4b3050eb5deb): 4 files, 4.0 MB, all from the cache"
        in json.dumps(write.payload, ensure_ascii=False)
    )
    console = ConsoleThread(stream=io.StringIO(), color=False)
    shown = console.render(Event(seq=17, goal_id=3, ts=utcnow(), data=HubFetched(fetch=fetch_record)))
    assert "📦" in shown and "Fetched model org/tiny (main, commit 4b3050eb5deb): 4 files, 4.0 MB" in shown
    assert classify_command("goaltender fetch Qwen/Qwen3-0.6B --include '*.json'", "/ws").action == "allow"
    assert classify_command("hf download Qwen/Qwen3-0.6B", "/ws").action == "ask"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- hubs that are not hubs ----


class NotAHub(http.server.BaseHTTPRequestHandler):
    """Every request answered by `mode`: a redirect to itself, or a captive portal's page."""

    mode = "redirect_loop"

    def log_message(self, *args) -> None:
        pass

    def answer(self) -> None:
        if self.mode == "redirect_loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"<html><body>Sign in to the guest network</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = answer


@contextlib.contextmanager
def not_a_hub(mode: str) -> Iterator[SimpleNamespace]:
    if mode == "silent":  # accepts connections (the kernel does) and never answers
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            yield SimpleNamespace(url=f"http://127.0.0.1:{listener.getsockname()[1]}")
        return
    handler = type("Handler", (NotAHub,), {"mode": mode})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        (
            "redirect_loop",
            "{url} (HF_ENDPOINT) redirects in a loop: check the address, or the proxy in between",
        ),
        ("captive_portal", "{url} (HF_ENDPOINT) does not answer like a Hugging Face hub: not JSON"),
        (
            "silent",
            "model org/tiny is not in the cache ({cache}) and the hub at {url} (HF_ENDPOINT) did not answer in time",
        ),
    ],
)
def test_a_hub_that_misbehaves_says_so_in_one_line(mode, why, tmp_path):
    with not_a_hub(mode) as hub:
        started = time.monotonic()
        out = fetch(hub, tmp_path, "org/tiny", HF_TOKEN=TOKEN, HF_HUB_ETAG_TIMEOUT="1")
        expected = "goaltender: " + why.format(url=hub.url, cache=tmp_path / "hf" / "hub")
        assert one_line_failure(out).startswith(expected), out.stderr
    assert time.monotonic() - started < 60
    assert "hf_" not in out.stderr


async def test_the_agent_does_not_wait_forever_for_a_fetch(start_runner, connect, model_server, monkeypatch):
    model = model_server
    with not_a_hub("silent") as hub:
        runner_environment(monkeypatch, hub)
        monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "600")  # the fetch itself would wait 10 minutes
        monkeypatch.setenv("GOALTENDER_FETCH_TIMEOUT_S", "2")
        model.add(Turn(tool_calls=[ToolCall("fetch_from_hub", {"repo": "org/tiny"})]), finished("Gave up."))
        runner = await start_runner(
            agents={"openai": [sys.executable, "-m", "goaltender.agents.openai_agent"]}
        )
        client = await connect(runner)
        goal_id = await submit(client, "fetch from a silent hub, max 1 experiments", agent="openai")
        await events_until_report(client, goal_id, timeout=30)
    [result] = [m["content"] for m in model.requests[1].body["messages"] if m["role"] == "tool"]
    assert result.startswith("timed out after 2s (GOALTENDER_FETCH_TIMEOUT_S): stopped waiting")
