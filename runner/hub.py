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
full disk, a refused token, a mirror's own login, a server error, --include patterns that match
no file. Messages name HF_TOKEN, never its value.

The library is kept quiet (its retry warnings would be dozens of lines for one failure; the
failure's own line says it all; HF_HUB_VERBOSITY=warning shows them again), and its retries on
server errors are bounded (ServerErrors): a request answered 5xx is tried SERVER_ERROR_TRIES
times, then the fetch ends, where the library alone would retry each file for ~23 s.
"""

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from huggingface_hub import HfApi, constants, set_client_factory, snapshot_download
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
from huggingface_hub.utils import filter_repo_objects, get_token, hf_raise_for_status
from huggingface_hub.utils import logging as hub_logging
from huggingface_hub.utils import tqdm as HubBar
from huggingface_hub.utils._http import default_client_factory

from goaltender.protocol.fetch_spec import FetchFailed as FetchFailed
from goaltender.protocol.fetch_spec import FetchSpec as FetchSpec
from goaltender.protocol.fetch_spec import spec_problem as spec_problem
from goaltender.runner.report import format_bytes
from goaltender.runner.secrets import url_shown
from goaltender.storage.records import HubFetch
from goaltender.storage.space import free_space, is_disk_full, probe_after_failure

MILESTONE_BYTES = 100 * 1000 * 1000
"""Downloads this big report their progress as milestones; smaller ones only their result."""
SERVER_ERROR_TRIES = 3
"""A request the hub answers 5xx is tried this often in all (the library waits 1 s, then 2 s)."""
FILES_SHOWN = 8
"""Files of the repo named when --include matches none of them."""
INVALID_TOKEN = "Invalid credentials in Authorization header"  # the hub's words for a token it does not know

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
    _quiet_library()
    SERVER_ERRORS.reset()
    set_client_factory(_client_with_timeouts)
    try:
        return _fetch(spec, report, milestone_bytes, keep_free)
    except FetchFailed:
        raise
    except Exception as exc:
        if (why := explain(exc, spec)) is None:
            raise
        raise FetchFailed(why) from exc


def _quiet_library() -> None:
    """huggingface_hub's warnings off (its retries, "No files matched"): a failure is said in one
    line, by explain. HF_HUB_VERBOSITY, when set, is the operator's to keep."""
    if not os.environ.get("HF_HUB_VERBOSITY"):
        hub_logging.set_verbosity_error()


def _client_with_timeouts() -> httpx2.Client:
    """huggingface_hub's HTTP client, with a timeout on every request: some of its calls (the repo
    info) pass none, and a hub that accepts a connection and never answers would hang the fetch;
    and with its retries on server errors bounded (ServerErrors)."""
    client = default_client_factory()
    hooks = client.event_hooks
    client.event_hooks = {
        **hooks,
        "request": [*hooks.get("request", []), _fill_timeouts],
        "response": [*hooks.get("response", []), SERVER_ERRORS.check],
    }
    return client


class ServerErrors:
    """Bounds the library's retries on 5xx answers. It retries a file's metadata request 5 times
    (1, 2, 4, 8, 8 s apart), for each file at once: a hub whose file store is down made one fetch
    print 34 lines over 24 s. Here a request is let through SERVER_ERROR_TRIES times; its next 5xx
    raises the library's own error (so no retry follows), and so does every 5xx after that in the
    fetch: the hub is failing, the other files need not wait their turn to find out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._tries: collections.Counter[tuple[str, str]] = collections.Counter()
            self._given_up = False

    def check(self, response: httpx2.Response) -> None:
        if response.status_code < 500:
            return
        request = (response.request.method, str(response.request.url))
        with self._lock:
            self._tries[request] += 1
            self._given_up = self._given_up or self._tries[request] >= SERVER_ERROR_TRIES
            give_up = self._given_up
        if give_up:
            response.read()  # a streamed download's body: the server's words are in it
            hf_raise_for_status(response)


SERVER_ERRORS = ServerErrors()


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
    if plan == [] and spec.include:  # the hub says what the repo holds: none of it matches
        raise FetchFailed(_matches_nothing(spec, _repo_files(spec), "it holds"))
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
    if not files and spec.include:  # served from the cache (the hub not asked): nothing there matches
        raise FetchFailed(_matches_nothing(spec, _snapshot_files(path), "its cached snapshot holds"))
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
    sizes = _snapshot_files(snapshot)
    kept = list(filter_repo_objects(sizes, allow_patterns=list(include) or None))
    return len(kept), sum(sizes[name] for name in kept)


def _snapshot_files(snapshot: Path) -> dict[str, int]:
    """Each file of a snapshot folder (none when it does not exist) and its size."""
    sizes: dict[str, int] = {}
    for folder, _, names in os.walk(snapshot):
        for name in names:
            file = Path(folder) / name
            sizes[file.relative_to(snapshot).as_posix()] = file.stat().st_size  # through the blob link
    return sizes


def _repo_files(spec: FetchSpec) -> list[str] | None:
    """The repo's files as the hub lists them (None: it did not say)."""
    try:
        return HfApi().list_repo_files(spec.repo, repo_type=spec.repo_type, revision=spec.revision)
    except (HfHubHTTPError, httpx2.HTTPError, OSError):
        return None


def _matches_nothing(spec: FetchSpec, files: Any, holder: str) -> str:
    """--include matched no file: the patterns, and a few files that are there to choose from."""
    patterns = " ".join(repr(pattern) for pattern in spec.include)
    at = spec.revision or constants.DEFAULT_REVISION
    said = f"no file of {spec.what} ({at}) matches --include {patterns}"
    names = sorted(files or ())
    if files is None:
        return f"{said} (the hub did not list its files)"
    if not names:
        return f"{said}: {holder} no files"
    shown = ", ".join(names[:FILES_SHOWN]) + (", …" if len(names) > FILES_SHOWN else "")
    count = f"{len(names)} file{'' if len(names) == 1 else 's'}"
    return f"{said}: {holder} {count}: {shown}"


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
    if (refused := _refusal(exc)) is not None:
        return _refused(refused, what)
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
        return _refused(exc, what)
    if status == 403:
        return f"{endpoint()} refused access to {what} (HTTP 403{_words(exc)}) with {_credentials_sent(exc)}"
    if status is not None and status >= 500:
        return (
            f"{endpoint()} failed (HTTP {status}{_words(exc)}) on {_target(exc)} while fetching {what}; "
            "try again later"
        )
    return f"{endpoint()} answered HTTP {status} for {what}: {_first_line(exc)}"


def _refusal(exc: BaseException) -> HfHubHTTPError | None:
    """A 401 in `exc`'s causes that is not the hub's word on a repo (private, missing or gated:
    its X-Error-Code says so): the endpoint refused the credentials it was sent, or wants some. A
    mirror's login in front of it (a proxy's basic auth) answers so, and huggingface_hub takes
    such a 401 on an https API address for "repository not found"."""
    answered = _cause(exc, HfHubHTTPError)
    if answered is None or answered.response is None or answered.response.status_code != 401:
        return None
    if answered.response.headers.get("X-Error-Code") in ("RepoNotFound", "GatedRepo"):
        return None
    return answered


def _refused(exc: HfHubHTTPError, what: str) -> str:
    """A 401: the hub refusing a token it does not know, or a mirror wanting its own login."""
    if _authorization(exc) == "Bearer" and exc.response.headers.get("X-Error-Message") == INVALID_TOKEN:
        return (
            f"{endpoint()} refused the token in {_token_source()} (401: invalid or expired); an operator "
            "replaces it in the runner's environment"
        )
    return (
        f"{endpoint()} ({_endpoint_source()}) refused the request for {what} (HTTP 401{_words(exc)}) "
        f"with {_credentials_sent(exc)}: give it the login it wants, as user:password@ in HF_ENDPOINT's "
        "address or a token in HF_TOKEN"
    )


def _request(exc: HfHubHTTPError) -> httpx2.Request | None:
    try:
        return exc.response.request if exc.response is not None else None
    except RuntimeError:  # a response made without one
        return None


def _authorization(exc: HfHubHTTPError) -> str | None:
    """The scheme of the credentials the failed request carried (Bearer, Basic), if any."""
    request = _request(exc)
    header = request.headers.get("Authorization", "") if request is not None else ""
    return header.split(" ", 1)[0] or None


def _credentials_sent(exc: HfHubHTTPError) -> str:
    """What the request carried, by name, never by value."""
    scheme = _authorization(exc)
    if scheme == "Basic":
        return "the user:password@ in HF_ENDPOINT's address (not shown)"
    if scheme == "Bearer":
        return f"the token in {_token_source()} (not shown)"
    return "no credentials (HF_TOKEN is not set, HF_ENDPOINT's address has no user:password@)"


def _token_source() -> str:
    """Where huggingface_hub took the token it sends: the environment, else a login's file."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(name, "").strip():
            return name
    return f"the login's token file {constants.HF_TOKEN_PATH}"


def _words(exc: HfHubHTTPError) -> str:
    """The server's own words on the failure (X-Error-Message or its JSON error), if it said any."""
    said = (exc.server_message or "").strip().splitlines()
    if said and not said[0].startswith("<"):  # a proxy's HTML page is no words
        return f": {said[0][:200]}"
    challenge = exc.response.headers.get("WWW-Authenticate", "") if exc.response is not None else ""
    return f", asking for a {challenge.split(' ', 1)[0]} login" if challenge else ""


def _target(exc: HfHubHTTPError) -> str:
    """What the failed request asked for: a file of the repo, or the API's address."""
    request = _request(exc)
    if request is None:
        return "a request"
    path = request.url.path
    if "/resolve/" in path:  # /{repo}/resolve/{revision}/{file}
        return "file " + path.split("/resolve/", 1)[1].partition("/")[2]
    return f"{request.method} {path}"


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
