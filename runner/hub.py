"""`goaltender fetch`: a model or data set from the Hugging Face hub, or a mirror, into the hub cache.

Its home is the runner package because it belongs to the box, yet it never runs in the daemon: it
runs in a `goaltender fetch` process and downloads with that process's environment. That process
is an operator's shell, or the one the runner starts for a goal's agent (runner/fetches.py): the
hub cache is shared by every goal and read-only in their sandboxes, so only the runner's own
download writes it, with the box's hub settings (HF_HUB_CACHE, HF_ENDPOINT for a mirror,
HF_HUB_OFFLINE) and HF_TOKEN when it is granted to goals (GOALTENDER_GRANTS). huggingface_hub
reads those variables when it is imported, so only that process imports this module.

The real client does the work, in two steps: a dry run of snapshot_download says what the
snapshot holds and what is not cached yet (so a download the disk has no room for is refused
before it starts, and a big one reports milestones: at its start, then at each quarter), then the
download itself; a repo folder in the cache with a link out of it is refused first (the download
would write through it). Every failure becomes FetchFailed, one line saying what happened and
what to do: a gated repo, no such repo or revision, the hub unreachable, offline and not cached, a
full disk, a refused token. Messages name HF_TOKEN, never its value.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from huggingface_hub import constants, set_client_factory, snapshot_download
from huggingface_hub.errors import (
    DisabledRepoError,
    DryRunError,
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import DryRunFileInfo, repo_folder_name
from huggingface_hub.utils import filter_repo_objects, get_token
from huggingface_hub.utils import tqdm as HubBar
from huggingface_hub.utils._http import default_client_factory

from goaltender.runner.fetch_spec import FetchFailed as FetchFailed
from goaltender.runner.fetch_spec import FetchSpec as FetchSpec
from goaltender.runner.fetch_spec import spec_problem as spec_problem
from goaltender.runner.report import format_bytes
from goaltender.runner.secrets import url_shown
from goaltender.storage.records import HubFetch
from goaltender.storage.space import free_space, is_disk_full, probe_after_failure

MILESTONE_BYTES = 100 * 1000 * 1000
"""Downloads this big report their progress as milestones; smaller ones only their result."""

Report = Callable[[str, str], None]  # (title, details): a milestone
E = TypeVar("E", bound=BaseException)


def hub_cache() -> Path:
    """Where snapshots land: $HF_HUB_CACHE, by default $HF_HOME/hub (for goals, the runner's
    shared hub cache: RunnerSettings.hub_cache)."""
    return Path(constants.HF_HUB_CACHE)


def endpoint() -> str:
    """The hub or mirror, as messages name it (never with credentials a mirror URL may carry)."""
    return url_shown(constants.ENDPOINT)


def fetch(
    spec: FetchSpec, report: Report, *, milestone_bytes: int = MILESTONE_BYTES, keep_free: int = 0
) -> HubFetch:
    """Download the snapshot `spec` names (or find it in the cache) and say what it holds.
    `keep_free`: bytes the cache's disk must still have free afterwards (the runner's reserve)."""
    set_client_factory(_client_with_timeouts)
    try:
        return _fetch(spec, report, milestone_bytes, keep_free)
    except FetchFailed:
        raise
    except Exception as exc:
        if (why := explain(exc, spec)) is None:
            raise
        raise FetchFailed(why) from exc


def _client_with_timeouts() -> httpx2.Client:
    """huggingface_hub's HTTP client, with a timeout on every request: some of its calls (the repo
    info) pass none, and a hub that accepts a connection and never answers would hang the fetch."""
    client = default_client_factory()
    client.event_hooks = {**client.event_hooks, "request": [*client.event_hooks["request"], _fill_timeouts]}
    return client


def _fill_timeouts(request: httpx2.Request) -> None:
    """Each unset timeout of the request (connect, read, write, pool) becomes HF_HUB_ETAG_TIMEOUT
    (10 s by default); downloads set their own (HF_HUB_DOWNLOAD_TIMEOUT)."""
    timeouts = request.extensions.get("timeout") or {}
    default = float(constants.HF_HUB_ETAG_TIMEOUT)
    request.extensions["timeout"] = {
        kind: default if timeouts.get(kind) is None else timeouts[kind]
        for kind in ("connect", "read", "write", "pool")
    }


def _fetch(spec: FetchSpec, report: Report, milestone_bytes: int, keep_free: int) -> HubFetch:
    _check_links(spec)
    plan = _plan(spec)
    progress = Progress(spec, report, milestone_bytes)
    if plan is not None:
        wanted = [f for f in plan if f.will_download]
        progress.total = sum(f.file_size or 0 for f in wanted)
        _check_room(spec, progress.total, keep_free)
        progress.begin(len(wanted))
    path = Path(
        snapshot_download(
            spec.repo,
            repo_type=spec.repo_type,
            revision=spec.revision,
            allow_patterns=list(spec.include) or None,
            tqdm_class=counting_bars(progress),
            etag_timeout=constants.HF_HUB_ETAG_TIMEOUT,
        )
    )
    files, size = _contents(path, spec.include)
    return HubFetch(
        repo=spec.repo,
        repo_type=spec.repo_type,
        revision=spec.revision or constants.DEFAULT_REVISION,
        commit=path.name,  # the snapshot's directory is named after its commit
        path=str(path),
        files=files,
        bytes=size,
        downloaded_bytes=progress.downloaded,
    )


def _plan(spec: FetchSpec) -> list[DryRunFileInfo] | None:
    """The snapshot's files and which of them are not cached yet; None when the hub cannot be
    asked (offline, unreachable, refused): then the download says why, or the cache serves it."""
    try:
        return snapshot_download(
            spec.repo,
            repo_type=spec.repo_type,
            revision=spec.revision,
            allow_patterns=list(spec.include) or None,
            tqdm_class=counting_bars(None),
            etag_timeout=constants.HF_HUB_ETAG_TIMEOUT,
            dry_run=True,
        )
    except DryRunError:
        return None


def _check_links(spec: FetchSpec) -> None:
    """Refuse to write through a link that leads out of the cache. The download writes the repo's
    folder (and its lock files) as whoever runs it, the runner for goals, following links: one left
    there while goals could write the cache would take the files anywhere that user may write."""
    cache = hub_cache()
    root = cache.resolve()
    folder = repo_folder_name(repo_id=spec.repo, repo_type=spec.repo_type)
    for top in (cache / folder, cache / ".locks" / folder):
        for path in [top, *_tree(top)]:
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                raise FetchFailed(
                    f"the cache of {spec.repo_type} {spec.repo} holds a link out of {cache} "
                    f"({path} -> {os.readlink(path)}); remove {top} and fetch again"
                )


def _tree(top: Path) -> list[Path]:
    """Everything under `top`, links included, without following them."""
    found = []
    for folder, dirs, files in os.walk(top):
        found += [Path(folder) / name for name in (*dirs, *files)]
    return found


def _check_room(spec: FetchSpec, needed: int, keep_free: int) -> None:
    """Refuse a download the cache's disk has no room for (huggingface_hub only warns), or that
    would eat into the `keep_free` bytes the runner keeps free. A disk that cannot be probed is
    left to the download, which says so if it fills up."""
    if not needed:
        return  # all cached: nothing is written
    try:
        free = free_space(_existing(hub_cache())).free_bytes
    except OSError:
        return
    if needed > free - keep_free:
        kept = f" and keeps {format_bytes(keep_free)} free (GOALTENDER_MIN_FREE_MB)" if keep_free else ""
        raise FetchFailed(
            f"disk full: {spec.repo_type} {spec.repo} needs {format_bytes(needed)} more in {hub_cache()}, "
            f"which has {format_bytes(free)} free{kept}; make room, or fetch fewer files with --include"
        )


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists (the cache may not be made yet)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _contents(snapshot: Path, include: tuple[str, ...]) -> tuple[int, int]:
    """(files, bytes) of the snapshot, only those `include` matches (others may be cached from an
    earlier fetch)."""
    sizes: dict[str, int] = {}
    for folder, _, names in os.walk(snapshot):
        for name in names:
            file = Path(folder) / name
            sizes[file.relative_to(snapshot).as_posix()] = file.stat().st_size  # through the blob link
    kept = list(filter_repo_objects(sizes, allow_patterns=list(include) or None))
    return len(kept), sum(sizes[name] for name in kept)


# ---- progress ----


class Progress:
    """Bytes downloaded so far, and the milestones a big download reports on the way: its start,
    then 25%, 50% and 75% (the result says the rest). Updated from the download's threads."""

    def __init__(self, spec: FetchSpec, report: Report, milestone_bytes: int):
        self.what = f"{spec.repo_type} {spec.repo}"
        self.revision = spec.revision or constants.DEFAULT_REVISION
        self.report = report
        self.milestone_bytes = milestone_bytes
        self.total = 0  # bytes to download, when the dry run told
        self.downloaded = 0
        self._next_quarter = 1
        self._lock = threading.Lock()

    @property
    def big(self) -> bool:
        return self.total >= self.milestone_bytes and self.total > 0

    def begin(self, files: int) -> None:
        if self.big:
            self.report(
                f"Downloading {self.what} ({format_bytes(self.total)})",
                f"{files} file{'' if files == 1 else 's'} at {self.revision} from {endpoint()} into {hub_cache()}",
            )

    def reached(self, downloaded: int) -> None:
        """A byte counter of the download reads `downloaded`."""
        with self._lock:  # milestones go out in order, each once
            self.downloaded = max(self.downloaded, downloaded)
            while (
                self.big and self._next_quarter < 4 and self.downloaded * 4 >= self.total * self._next_quarter
            ):
                self.report(
                    f"Downloading {self.what}: {25 * self._next_quarter}% of {format_bytes(self.total)}", ""
                )
                self._next_quarter += 1


def counting_bars(progress: Progress | None) -> type[HubBar]:
    """A progress bar class for snapshot_download that draws nothing and tells `progress` the
    bytes its byte counters reach. snapshot_download counts the bytes of all its files twice
    (received and written), each in one bar: the larger count is how far it is."""

    class CountingBar(HubBar):
        monitor_interval = 0  # no monitor thread

        def __init__(self, *args: Any, **kwargs: Any):
            self.counts_bytes = kwargs.get("unit") == "B"
            self.counted = 0
            super().__init__(*args, **{**kwargs, "disable": True})

        def update(self, n: float | None = 1) -> bool | None:
            self.counted += int(n or 0)
            if self.counts_bytes and progress is not None:
                progress.reached(self.counted)
            return None

    return CountingBar


# ---- failures in one line ----


def explain(exc: BaseException, spec: FetchSpec) -> str | None:
    """What went wrong, for people and agents (None: not a failure this module knows)."""
    what = f"{spec.repo_type} {spec.repo}"
    at = f" at {spec.revision}" if spec.revision else ""
    hub = endpoint()
    if isinstance(exc, GatedRepoError):
        return f"{what} is gated: {_gated_advice(spec)}"
    if isinstance(exc, RepositoryNotFoundError):
        return f"no {what} on {hub}{_not_found_advice(spec)}"
    if isinstance(exc, RevisionNotFoundError):
        return f"{what} has no revision {spec.revision!r} on {hub}"
    if isinstance(exc, DisabledRepoError):
        return f"{what} is disabled on {hub}"
    if isinstance(exc, IncompleteSnapshotError):
        return f"the cached snapshot of {what}{at} is incomplete and {_why_not_online(exc)}"
    if isinstance(exc, OfflineModeIsEnabled | LocalEntryNotFoundError):
        if constants.HF_HUB_OFFLINE:
            return (
                f"HF_HUB_OFFLINE is set and {what}{at} is not in the cache ({hub_cache()}): fetch it "
                "once where the hub is reachable, or unset HF_HUB_OFFLINE"
            )
        if (not_a_hub := _cause(exc, FileMetadataError)) is not None:
            return f"{hub} ({_endpoint_source()}) does not answer like a Hugging Face hub: {_first_line(not_a_hub)}"
        if (answered := _cause(exc, HfHubHTTPError)) is not None:  # e.g. the hub is down
            return _http_failure(answered, what)
        return f"{what}{at} is not in the cache ({hub_cache()}) and {_why_not_online(exc)}"
    if isinstance(exc, HfHubHTTPError):
        return _http_failure(exc, what)
    if isinstance(exc, httpx2.TimeoutException):
        return f"{_no_answer(exc)} while fetching {what}; run it again to resume"
    if isinstance(exc, httpx2.TransportError):
        return f"lost the hub at {hub} while fetching {what} ({_first_line(exc)}); run it again to resume"
    if isinstance(exc, httpx2.TooManyRedirects):
        return f"{hub} ({_endpoint_source()}) redirects in a loop: check the address, or the proxy in between"
    if (not_json := _cause(exc, json.JSONDecodeError)) is not None:
        return (
            f"{hub} ({_endpoint_source()}) does not answer like a Hugging Face hub: not JSON "
            f"({_first_line(not_json)}); a login page or a proxy's may be in the way"
        )
    if is_disk_full(exc):
        space = probe_after_failure(_existing(hub_cache()))
        return f"disk full while fetching {what}: {format_bytes(space.free_bytes)} free on {space.path}"
    if isinstance(exc, OSError):
        return f"cannot fetch {what}: {_first_line(exc)}"
    return None


def _http_failure(exc: HfHubHTTPError, what: str) -> str:
    status = exc.response.status_code if exc.response is not None else None
    if status == 401:
        return (
            f"{endpoint()} refused the token in HF_TOKEN (401: invalid or expired); an operator "
            "replaces it in the runner's environment"
        )
    if status == 403:
        return f"{endpoint()} refused access to {what} (403) with the token in HF_TOKEN"
    if status is not None and status >= 500:
        return f"{endpoint()} failed (HTTP {status}) while fetching {what}; try again later"
    return f"{endpoint()} answered HTTP {status} for {what}: {_first_line(exc)}"


def _gated_advice(spec: FetchSpec) -> str:
    page = f"{endpoint()}/{'datasets/' if spec.repo_type == 'dataset' else ''}{spec.repo}"
    if get_token() is None:
        return (
            f"it needs a token, in HF_TOKEN, of an account that accepted its terms at {page}; HF_TOKEN "
            "is not set (an operator sets it for the runner, which grants it to goals)"
        )
    return f"the account whose token is in HF_TOKEN has no access yet: accept its terms at {page}"


def _not_found_advice(spec: FetchSpec) -> str:
    other = "--type dataset" if spec.repo_type == "model" else "--type model"
    private = (
        "if it is private, it needs a token with access in HF_TOKEN, which is not set"
        if get_token() is None
        else "if it is private, the token in HF_TOKEN has no access to it"
    )
    return f" (check the name; is it a {other.split()[1]}? use {other}; {private})"


def _why_not_online(exc: BaseException) -> str:
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set: fetch it where the hub is reachable, or unset HF_HUB_OFFLINE"
    if (timeout := _cause(exc, httpx2.TimeoutException)) is not None:
        return _no_answer(timeout)
    cause = _cause(exc, httpx2.TransportError)
    why = f": {_first_line(cause)}" if cause is not None else ""
    return f"the hub at {endpoint()} ({_endpoint_source()}) cannot be reached{why}"


def _no_answer(exc: httpx2.TimeoutException) -> str:
    return (
        f"the hub at {endpoint()} ({_endpoint_source()}) did not answer in time ({_first_line(exc)}; "
        "HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT set the seconds)"
    )


def _endpoint_source() -> str:
    return "HF_ENDPOINT" if os.environ.get("HF_ENDPOINT") else "the default; HF_ENDPOINT names a mirror"


def _cause(exc: BaseException | None, kind: type[E]) -> E | None:
    """The first exception of `kind` in `exc`'s chain of causes."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
