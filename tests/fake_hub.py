"""A fake Hugging Face hub for tests: the HTTP endpoints huggingface_hub's snapshot_download calls
(huggingface_hub 2.x), answered as the hub answers them, so the real client runs unmodified with
HF_ENDPOINT pointing here.

    hub = FakeHub()
    hub.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": big_bytes})
    hub.add_repo("org/data", {"train.jsonl": b"..."}, repo_type="dataset")
    hub.add_repo("org/gated", {...}, gated=True)      # its files need a token with access
    hub.add_repo("org/private", {...}, private=True)  # all of it needs a token with access
    hub.tokens["hf_..."] = {"org/private"}            # a valid token, and the gated/private repos it may read
    url = hub.start()                                 # http://127.0.0.1:PORT, served from a thread
    ...
    hub.requests                                      # every request: method, path, whether it had a token
    hub.hold()                                        # file downloads wait (hub.held counts them) ...
    hub.release()                                     # ... until released
    hub.stop()

Endpoints:
  GET /api/{models|datasets}/{owner}/{name}/revision/{rev}     repo info: id, sha (the commit), siblings
  GET /api/{models|datasets}/{owner}/{name}                    the same, of main
  GET /api/{models|datasets}/{owner}/{name}/tree/{commit}      the files: path, size, oid (and lfs)
  HEAD, GET /{owner}/{name}/resolve/{rev}/{path}               a file (datasets: /datasets/{owner}/…)
      with X-Repo-Commit and ETag; files over 1 MB are "LFS" ones: X-Linked-Etag (their sha256)
      and X-Linked-Size, as the hub sends them. No Xet headers: the client downloads over HTTP.

`hub.busy = N`: the next N file downloads (GET /resolve/) answer 429 Too Many Requests, which
huggingface_hub retries after logging the URL it asked.

`hub.files_down = 503`: every file request (HEAD and GET /resolve/) answers that status, with the
hub's X-Error-Message and JSON error (`hub.files_down_words`); the API still answers (a storage
backend in trouble). `hub.down = 503`: every request does.

`hub.login = ("user", "password")`: the mirror's own login in front of it, as a proxy with basic
auth does: a request without those credentials answers 401 with `WWW-Authenticate: Basic` and the
proxy's HTML page, whatever token it carries (the hub's own 401 says "Invalid credentials in
Authorization header" in X-Error-Message). With it, the hub reads no token: the Authorization
header is the login's.

Errors carry the hub's X-Error-Code and X-Error-Message, which huggingface_hub turns into its own
exceptions: RepoNotFound (401 without a valid token: the hub does not say whether a private repo
exists; 404 with one), GatedRepo (401 without a token, 403 without access), RevisionNotFound,
EntryNotFound, and 401 "Invalid credentials in Authorization header" for a token it does not know.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

LFS_FROM = 1_000_000  # bytes: bigger files are stored (and served) as LFS files


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    revisions: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files
    gated: bool = False
    private: bool = False


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    with_token: bool


def commit_of(repo_id: str, files: dict[str, bytes]) -> str:
    digest = hashlib.sha1(repo_id.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha1(files[name]).digest())
    return digest.hexdigest()


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        self.tokens: dict[str, set[str]] = {}  # a valid token -> the gated or private repos it may read
        self.requests: list[Seen] = []
        self.down: int | None = None  # a status (503) every request gets: the hub is down
        self.held = 0  # file downloads that have waited on hold()
        self._gate: asyncio.Event | None = None  # set: downloads go on (None: never held)
        self.busy = 0  # file downloads still to answer 429 (each is retried)
        self.files_down: int | None = None  # a status every file request gets (HEAD and GET)
        self.files_down_words = "storage backend unavailable"
        self.login: tuple[str, str] | None = None  # the mirror's own basic auth, in front of the hub
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    # ---- the hub's contents ----

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        repo_type: str = "model",
        gated: bool = False,
        private: bool = False,
    ) -> str:
        """A repo whose main branch holds `files`; returns main's commit."""
        repo = Repo(repo_id, repo_type, gated=gated, private=private)
        self.repos[(repo_type, repo_id)] = repo
        return self.add_revision(repo_id, "main", files, repo_type=repo_type)

    def add_revision(
        self, repo_id: str, name: str, files: dict[str, bytes], *, repo_type: str = "model"
    ) -> str:
        """A branch or tag `name` of the repo, holding `files`; returns its commit."""
        repo = self.repos[(repo_type, repo_id)]
        commit = commit_of(f"{repo_id}@{name}", files)
        repo.commits[commit] = dict(files)
        repo.revisions[name] = commit
        return commit

    # ---- serving ----

    def start(self) -> str:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="fake-hub", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake hub did not start")
        return self.url

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._listen())
        ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
        self._loop.close()

    async def _listen(self) -> None:
        app = web.Application()
        kinds = "{kind:models|datasets}"
        app.router.add_get(f"/api/{kinds}/{{owner}}/{{name}}", self._info)  # main's: doctor's probe
        app.router.add_get(f"/api/{kinds}/{{owner}}/{{name}}/revision/{{rev}}", self._info)
        app.router.add_get(f"/api/{kinds}/{{owner}}/{{name}}/tree/{{rev}}", self._tree)
        app.router.add_get("/datasets/{owner}/{name}/resolve/{rev}/{path:.+}", self._file)
        app.router.add_get("/{owner}/{name}/resolve/{rev}/{path:.+}", self._file)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def hold(self) -> None:
        """File downloads (GET …/resolve/…) wait from now on, until release()."""

        async def close_the_gate() -> None:
            self._gate = asyncio.Event()

        self._in_loop(close_the_gate())

    def release(self) -> None:
        async def open_the_gate() -> None:
            if self._gate is not None:
                self._gate.set()

        self._in_loop(open_the_gate())

    def _in_loop(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None, "start() first"
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def count(self, method: str, contains: str = "") -> int:
        return sum(1 for r in self.requests if r.method == method and contains in r.path)

    # ---- handlers ----

    async def _info(self, request: web.Request) -> web.Response:
        repo, commit, problem = self._resolve(request, files_too=False)
        if problem is not None:
            return problem
        assert repo is not None and commit is not None
        siblings = [{"rfilename": name} for name in sorted(repo.commits[commit])]
        return web.json_response(
            {
                "id": repo.repo_id,
                "sha": commit,
                "private": repo.private,
                "gated": "manual" if repo.gated else False,
                "siblings": siblings,
            }
        )

    async def _tree(self, request: web.Request) -> web.Response:
        repo, commit, problem = self._resolve(request, files_too=False)
        if problem is not None:
            return problem
        assert repo is not None and commit is not None
        return web.json_response([_entry(path, data) for path, data in sorted(repo.commits[commit].items())])

    async def _file(self, request: web.Request) -> web.StreamResponse:
        repo, commit, problem = self._resolve(request, files_too=True)
        if problem is not None:
            return problem
        if request.method == "GET" and self.busy > 0:
            self.busy -= 1
            return web.json_response({"error": "too many requests"}, status=429)
        assert repo is not None and commit is not None
        path = request.match_info["path"]
        data = repo.commits[commit].get(path)
        if data is None:
            return _error(404, "EntryNotFound", f"{path} does not exist on {commit}", commit)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{_git_oid(data)}"', "Accept-Ranges": "bytes"}
        if len(data) >= LFS_FROM:
            sha256 = hashlib.sha256(data).hexdigest()
            headers |= {
                "ETag": f'"{sha256}"',
                "X-Linked-Etag": f'"{sha256}"',
                "X-Linked-Size": str(len(data)),
            }
        if request.method == "HEAD":
            return web.Response(headers=headers | {"Content-Length": str(len(data))})
        if self._gate is not None and not self._gate.is_set():
            self.held += 1
            await self._gate.wait()
        return web.Response(body=data, headers=headers, content_type="application/octet-stream")

    def _resolve(
        self, request: web.Request, *, files_too: bool
    ) -> tuple[Repo | None, str | None, web.Response | None]:
        """(repo, commit, None), or the error the hub would answer with."""
        info = request.match_info
        token = _bearer(request)
        self.requests.append(Seen(request.method, request.path, token is not None))
        if self.login is not None:
            if _basic(request) != self.login:
                return None, None, _login_required()
            token = None  # the Authorization header was the login's
        if self.down is not None:
            return None, None, web.json_response({"error": "down for maintenance"}, status=self.down)
        if files_too and self.files_down is not None:
            words = self.files_down_words
            return None, None, _error(self.files_down, None, words)
        if token is not None and token not in self.tokens:
            return None, None, _error(401, None, "Invalid credentials in Authorization header")
        is_dataset = info.get("kind") == "datasets" or request.path.startswith("/datasets/")
        repo_type = "dataset" if is_dataset else "model"
        repo_id = f"{info['owner']}/{info['name']}"
        repo = self.repos.get((repo_type, repo_id))
        allowed = token is not None and repo_id in self.tokens.get(token, set())
        if repo is None or (repo.private and not allowed):
            status = 404 if token is not None else 401
            return None, None, _error(status, "RepoNotFound", "Repository not found")
        rev = info.get("rev", "main")
        commit = repo.revisions.get(rev, rev if rev in repo.commits else None)
        if commit is None:
            return None, None, _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if files_too and repo.gated and not allowed:
            message = (
                f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            )
            return None, None, _error(403 if token is not None else 401, "GatedRepo", message)
        return repo, commit, None


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return None
    return header.removeprefix("Bearer ").strip() or None


def _basic(request: web.Request) -> tuple[str, str] | None:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Basic "):
        return None
    user, _, password = base64.b64decode(header.removeprefix("Basic ")).decode().partition(":")
    return user, password


def _login_required() -> web.Response:
    """What nginx answers a request without its basic auth: an HTML page, no hub headers."""
    page = "<html><head><title>401 Authorization Required</title></head><body>401 Authorization Required</body></html>"
    return web.Response(
        status=401,
        text=page,
        content_type="text/html",
        headers={"WWW-Authenticate": 'Basic realm="mirror"'},
    )


def _error(status: int, code: str | None, message: str, commit: str | None = None) -> web.Response:
    headers = {"X-Error-Message": message}
    if code is not None:
        headers["X-Error-Code"] = code
    if commit is not None:
        headers["X-Repo-Commit"] = commit
    return web.json_response({"error": message}, status=status, headers=headers)


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _entry(path: str, data: bytes) -> dict:
    entry: dict = {"type": "file", "path": path, "size": len(data), "oid": _git_oid(data)}
    if len(data) >= LFS_FROM:
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry
