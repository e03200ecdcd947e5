"""The zygote: a child of the supervisor that has imported what a worker runs (numpy, zarr,
pyfuse3, trio, obstore, shardfs's layers) and opened nothing of the source, and forks a
worker on request: a new worker serves in the time of a fork and of building its layers, not
of an interpreter's start and imports (about 1 s, several on a loaded machine), and the
workers of ``-o workers=N`` share the zygote's pages (copy on write).

A zygote is this program's worker command line with ``--zygote FD`` (``shardfs.app.cli``):
a fresh process, so a zygote runs the package installed when it started. The supervisor
starts one at the mount and another for a handover (``shardfs mount`` on the live mount:
the new package, the new options), and stops the old one.

Protocol, over a ``SOCK_SEQPACKET`` socket pair (one JSON message a packet):

- zygote: ``{"ready": true}`` once imported;
- supervisor: ``{"env": {...}, "given": [NAME, ...]}`` with descriptors (``SCM_RIGHTS``): fork a
  worker with these environment variables added, which talks to the supervisor over the first
  descriptor (``shardfs.app.supervisor.Connection``) and inherits the others, each NAME set to
  its number (the ledger's memfd: ``SHARDFS_LEDGER_FD``);
- zygote: ``{"pid": N}``, the worker's pid, or ``{"error": "..."}``.

The worker is forked twice (the middle process exits at once), so that it is reparented to
the supervisor, a child subreaper (``PR_SET_CHILD_SUBREAPER``): the supervisor waits for it
and sees its exit status as for a process it started itself (``Child``). The worker waits
until it has been reparented before it asks to die with its parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import time
from typing import Any, Callable

from shardfs.base.libc import LIBC

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
READY_TIMEOUT = 120.0  # seconds for a zygote to import (a loaded machine) and to answer a fork


def prctl(option: int, value: int | bytes) -> None:
    LIBC.prctl(option, ctypes.c_char_p(value) if isinstance(value, bytes) else value, 0, 0, 0)


def name(comm: str) -> None:
    """This process's name as ``ps``, ``top`` and ``/proc/PID/comm`` show it (a forked worker's
    command line is its zygote's): ``shardfs-worker``, ``shardfs-zygote``."""
    prctl(PR_SET_NAME, comm.encode()[:15])


def die_with_parent(parent: int | None = None) -> None:
    """SIGKILL this process when its parent dies; at once if its parent is already gone (it is
    not ``parent``, or is init)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1 or (parent is not None and os.getppid() != parent):
        os.kill(os.getpid(), signal.SIGKILL)


def workers_of(supervisor: int) -> list[int]:
    """The pids of a supervisor's workers: its children named ``shardfs-worker`` (for tools and
    tests; its other children are the zygote and what a dead worker's children left)."""
    try:
        with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return []
    found = []
    for pid in children:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "shardfs-worker":
                    found.append(pid)
        except OSError:
            pass
    return found


class Child:
    """A child process of the supervisor, started by it (``exec``) or by its zygote (reparented
    to it): ``poll``, ``wait``, ``send_signal`` and ``kill`` as ``subprocess.Popen``'s."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped already: not ours to know how it ended
            self.returncode = -signal.SIGKILL
            return
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(argv: list[str], env: dict[str, str], fds: list[int]) -> Child:
    """Start ``argv`` (a fresh interpreter; ``argv[0]`` its path) with ``env`` and descriptors
    ``fds`` (inherited as the same numbers; every other one of this process is close-on-exec),
    stdin ``/dev/null``."""
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    for fd in fds:
        os.set_inheritable(fd, True)
    try:
        return Child(os.posix_spawn(argv[0], argv, env, file_actions=[(os.POSIX_SPAWN_DUP2, null, 0)]))
    finally:
        for fd in fds:
            os.set_inheritable(fd, False)
        os.close(null)


class Zygote:
    """The supervisor's side: a zygote started for worker command line ``argv`` (its fresh
    process, ``proc``), and ``fork``. ``OSError`` if it cannot be started or does not answer."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = spawn([*argv, "--zygote", str(theirs.fileno())], env, [theirs.fileno()])
        finally:
            theirs.close()
        self.ready = False

    def fork(self, env: dict[str, str], fd: int, given: dict[str, int] | None = None) -> Child:
        """A worker forked with ``env`` added to the zygote's environment, given ``fd`` (its
        socket to the supervisor) and the descriptors ``given``, each under the number the
        environment variable naming it says in the worker."""
        self.ctl.settimeout(READY_TIMEOUT)
        if not self.ready:
            self.ready = json.loads(self._recv()).get("ready") is True
            if not self.ready:
                raise OSError("the zygote did not start")
        given = given or {}
        socket.send_fds(self.ctl, [json.dumps({"env": env, "given": list(given)}).encode()], [fd, *given.values()])
        answer = json.loads(self._recv())
        if "pid" not in answer:
            raise OSError(f"the zygote cannot fork: {answer.get('error')}")
        return Child(int(answer["pid"]))

    def _recv(self) -> bytes:
        data = self.ctl.recv(1 << 16)
        if not data:
            raise OSError("the zygote ended")
        return data

    def close(self) -> None:
        """Stop it (closing its socket ends it; SIGKILL if it is still importing)."""
        self.ctl.close()
        self.proc.kill()
        self.proc.wait()


# ----- the zygote's side ------------------------------------------------------------------


def serve(fd: int, preload: Callable[[], None], run_worker: Callable[[int], int]) -> int:
    """Be a zygote (``--zygote FD``): ``preload`` (the imports), then fork a worker per request
    until the supervisor closes the socket; a worker runs ``run_worker(its descriptor)`` and
    ends with its status, without interpreter teardown."""
    ctl = socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    name("shardfs-zygote")
    supervisor = os.getppid()
    die_with_parent(supervisor)
    before = os.environ.get("SHARDFS_OOM_SCORE_ADJ")  # the supervisor's protection is not for the zygote
    if before is not None:
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
            f.write(before)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the supervisor (-f)
    preload()
    ctl.send(json.dumps({"ready": True}).encode())
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, 8)
        except OSError:
            data, fds = b"", []
        if not data:
            return 0
        try:
            msg = json.loads(data)
            env = {**msg["env"], **{name: str(fd) for name, fd in zip(msg.get("given", []), fds[1:])}}
            pid = _fork(ctl, fds[0], env, supervisor, run_worker)
            answer: dict[str, Any] = {"pid": pid}
        except (OSError, ValueError, KeyError, IndexError) as e:
            answer = {"error": str(e)}
        finally:
            for given in fds:
                os.close(given)
        ctl.send(json.dumps(answer).encode())


def _fork(ctl: socket.socket, fd: int, env: dict[str, str], supervisor: int,
          run_worker: Callable[[int], int]) -> int:
    """Fork twice; the grandchild, reparented to ``supervisor``, becomes the worker."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        code = 1
        try:
            os.close(r)
            me = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _worker(ctl, fd, env, middle_pid=me, supervisor=supervisor, run_worker=run_worker)
            os.write(w, str(pid).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as pipe:
            said = pipe.read()
    finally:
        os.waitpid(middle, 0)
    if not said:
        raise OSError("fork failed")
    return int(said)


def _worker(ctl: socket.socket, fd: int, env: dict[str, str], middle_pid: int, supervisor: int,
            run_worker: Callable[[int], int]) -> None:
    code = 1
    try:
        name("shardfs-worker")
        ctl.close()
        os.environ.update(env)
        os.environ["SHARDFS_SUPERVISOR_PID"] = str(supervisor)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        while os.getppid() == middle_pid:  # the middle process exits at once: then the supervisor is the parent
            time.sleep(0.0005)
        code = run_worker(fd)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - a worker ends here, whatever happened (its log says why)
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
