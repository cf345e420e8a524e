"""A standby interpreter, inside a goal's sandbox: imports the preloaded modules, waits for the
command it is to become, then runs it as `python -m module …` or `python script.py …` would.

Started by the runner (runner/standby.py) as

    python -c STANDBY_LOADER /path/to/standby_process.py FD MODULE…

and never imported: it runs in a namespace of its own, so that nothing of it lands in sys.modules
or in __main__. It uses the standard library only, and imports nothing the command might find
differently (a module of the command's working directory shadowing a preloaded one, or a preloaded
module whose file changed while it waited): where that could happen it execs the command instead,
a cold start in the same process.

On socket FD: `r` once the modules are imported; then the hand-off, a 4-byte length and JSON
{"argv", "cwd", "env"} (the late variables: a value, or null to unset), with the run's log as one
SCM_RIGHTS descriptor. What the imports printed while waiting goes to that log first. A hand-off
that comes while the modules are still being imported (a run took a standby still warming) stops
the imports there: the run imports what it needs of the rest itself, as a cold start would, so the
modules are best listed in the order runs need them.

One difference from a fresh interpreter remains, on purpose: the objects the imports made are
frozen (gc.freeze), so the collector never frees one of them that ends up in a cycle.
"""

import sys

_AT_START = set(sys.modules)  # the loader imported nothing: what a fresh interpreter has

import builtins  # noqa: E402 - after _AT_START: these count among what the standby loaded
import contextlib  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import importlib.machinery  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402

MAX_HANDOFF = 16 << 20  # bytes: an argv and environment far beyond what execve takes


def main(fd: int, preload: list[str]) -> None:
    if sys.path and sys.path[0] == "":
        del sys.path[0]  # `-c` put the working directory first; the command's own form decides
    waiting_output = os.memfd_create("goaltender-standby-output")
    os.dup2(waiting_output, 1)
    os.dup2(waiting_output, 2)
    channel = socket.socket(fileno=fd)
    for name in preload:
        if _handed_off(channel):
            break  # a run waits for this standby: it imports what it needs of the rest itself
        with contextlib.suppress(Exception):  # the command meets the same failure itself, and says it
            importlib.import_module(name)
    loaded = {name.partition(".")[0] for name in set(sys.modules) - _AT_START}
    sources = _sources()
    # As a server does before it forks workers: what the imports made is never walked by the
    # cyclic GC again, in the run's collections or at its exit (numpy's and PIL's: 20 of 28 ms).
    # No collection first: imports leave next to no cyclic garbage (star count's preload none of
    # 25k objects), and it cost 5-7 ms, a run's own when it took this standby still warming.
    gc.freeze()

    with contextlib.suppress(OSError):  # closed already: a hand-off may wait in it all the same
        channel.sendall(b"r")  # warm: the runner may start the goal's next standby
    handoff = _receive(channel)
    if handoff is None:
        os._exit(0)  # the runner let this standby go: nothing to run
    order, log = handoff
    sys.stdout.flush()
    sys.stderr.flush()
    os.lseek(waiting_output, 0, os.SEEK_SET)
    while chunk := os.read(waiting_output, 1 << 16):
        os.write(log, chunk)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(waiting_output)

    argv: list[str] = order["argv"]
    for name, value in order["env"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        os.chdir(order["cwd"])
    except OSError as exc:
        print(f"goaltender: cannot enter {order['cwd']}: {exc.strerror}", file=sys.stderr)
        os._exit(1)

    if _which(argv[0]) != sys.executable:
        _cold(argv)  # the sandbox's PATH names another interpreter than the runner saw
    if any(_stat(path) != was for path, was in sources.items()):
        _cold(argv)  # a preloaded module's file changed while this waited (one on a writable path)
    if argv[1] == "-m":
        first = os.getcwd()
        script = None
    else:
        script = os.path.abspath(argv[1])
        first = os.path.dirname(os.path.realpath(script))
        if not (script.endswith(".py") and os.path.isfile(script)):
            _cold(argv)  # a directory, a zip, a missing file: the interpreter's own words for it
    if not sys.flags.safe_path:
        if any(importlib.machinery.PathFinder.find_spec(name, [first]) for name in loaded):
            _cold(argv)  # the command would import its own module of that name, not the preloaded one
        sys.path.insert(0, first)
    sys.orig_argv = list(argv)

    main_module = sys.modules["__main__"]
    main_module.__dict__.clear()  # back to what a fresh interpreter's __main__ holds
    main_module.__dict__.update(
        __name__="__main__",
        __doc__=None,
        __package__=None,
        __loader__=importlib.machinery.BuiltinImporter,
        __spec__=None,
        __annotations__={},
        __builtins__=builtins,
    )
    if script is None:
        sys.argv = ["-m", *argv[3:]]
        import runpy

        runpy._run_module_as_main(argv[2], alter_argv=True)  # type: ignore[attr-defined]  # what `python -m` calls
    else:
        sys.argv = argv[1:]
        with open(script, "rb") as f:
            code = compile(f.read(), script, "exec", dont_inherit=True)
        main_module.__dict__.update(
            __file__=script,
            __cached__=None,
            __loader__=importlib.machinery.SourceFileLoader("__main__", script),
        )
        exec(code, main_module.__dict__)


def _handed_off(channel: socket.socket) -> bool:
    """Has the hand-off come, or has the runner let this standby go? Looked at, not taken: the
    hand-off (its descriptor too) stays for _receive."""
    try:
        channel.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


def _receive(channel: socket.socket) -> tuple[dict, int] | None:
    """The hand-off (the order and the log's descriptor), or None when the runner closed the socket."""
    try:
        data, fds, _, _ = socket.recv_fds(channel, 1 << 16, 1)
    except OSError:
        return None
    if len(data) < 4 or len(fds) != 1:
        return None
    (size,) = struct.unpack("!I", data[:4])
    data = data[4:]
    while len(data) < size <= MAX_HANDOFF:
        more = channel.recv(min(1 << 20, size - len(data)))
        if not more:
            return None
        data += more
    channel.close()
    return json.loads(data), fds[0]


def _sources() -> dict[str, tuple[int, int]]:
    """The files of the modules the standby imported, each with its modification time and size:
    what a fresh interpreter's import checks its cached bytecode against."""
    paths = (getattr(sys.modules[name], "__file__", None) for name in set(sys.modules) - _AT_START)
    return {path: _stat(path) for path in paths if isinstance(path, str)}


def _stat(path: str) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return (-1, -1)
    return (stat.st_mtime_ns, stat.st_size)


def _which(name: str) -> str | None:
    """The file `name` runs, as execvp finds it on this process's PATH."""
    if "/" in name:
        return os.path.abspath(name)
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    return None


def _cold(argv: list[str]) -> None:
    """Become the command itself, as a fresh interpreter would start it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)  # found on PATH, as the sandbox would have found it


if __name__ == "goaltender_standby":  # as the loader runs it; never on import
    main(int(sys.argv[2]), sys.argv[3:])
