"""The supervisor: the process ``shardfs mount`` leaves, which holds the mount and its FUSE
connection while workers (its children) serve it: one, or ``-o workers=N`` at once.

With N workers each has a slot (0 .. N-1) and its own device file of the connection: slot 0
the supervisor's own descriptor, every other slot a ``FUSE_DEV_IOC_CLONE`` clone made at the
mount (``fusedev.clone``). The supervisor keeps every slot's descriptor open for the mount's
life and gives each worker the same open file (``SCM_RIGHTS``), so the requests a dying worker
had read stay on its slot's processing list for the kernel to send again; the worker makes it
non-blocking (every reader of a connection is woken for each request, one gets it).
Slot 0 starts first and answers FUSE_INIT; the others get the connection once its bytes are
known (they replay them). The slots' workers are written to ``workers-PID.json`` beside the
status socket (``shardfs status`` shows each).

It does no I/O on the source and imports nothing heavy (``shardfs.app.fusedev`` and the
standard library), so it stays small, and it asks the OOM killer to spare it (``oom_score_adj``
-1000, or as low as it may set; each worker sets its own back). The connection lives as long as
it holds ``/dev/fuse``: while no worker serves it, requests wait in the kernel.

A worker (``python -m shardfs mount ... --worker FD``, the package installed now) inherits the
memfd of the connection's ledger (``shardfs.tree.ledger``: made here, kept for the mount's life,
the same for every worker; its number in ``SHARDFS_LEDGER_FD``), with N workers the memfd of
the table of what the kernel's page cache holds (``shardfs.kernel.pagetable``,
``SHARDFS_PAGES_FD``) and that of the versions of the source's keys the workers remember
(``shardfs.storage.sharedversions``, ``SHARDFS_VERSIONS_FD``), on a read-only mount of a remote
source that of the shards fetched whole (``shardfs.storage.sharedshards``, ``SHARDFS_SHARDS_FD``),
and talks to the supervisor
over a ``SOCK_SEQPACKET`` socket pair, one JSON message a packet:

- worker: ``{"ready": true}`` once its layers are built (the journal replayed), or ``{"error":
  "..."}`` (then it exits);
- supervisor: the connection's descriptor (``SCM_RIGHTS``: the same open file) with ``{"init":
  base64 or null, "status": {...}}`` (mounting first if nothing is mounted yet);
- worker: ``{"init": base64}`` after it answered the kernel's FUSE_INIT (the first worker:
  kept here, in memory, for every later worker to replay), then ``{"serving": true}`` once
  its session is ready (a later worker has asked the kernel to resend what the dead one had
  read: ``fusedev.resend``).

``shardfs mount`` on the live mount (``shardfs.app.handover``) leaves the next worker's command
line and sends SIGUSR1: the worker folds what is pending and stops (SIGUSR1 to it), and a worker
of that command line (the package installed now, the new options) takes the connection over
as after a death, counted as a takeover.

A worker that dies of anything but a clean end (status 0: unmounted, or stopped by SIGTERM
after folding) is replaced on the same connection: a fresh process, at once. After
``CRASH_LOOP`` deaths within ``CRASH_WINDOW`` seconds the supervisor gives up: one log line,
the mount is detached, and it exits 1. SIGTERM/SIGINT are passed to the worker (it folds pending
writes and ends); the supervisor then unmounts and exits. If the supervisor itself is killed,
its worker gets SIGKILL (``PR_SET_PDEATHSIG``) and the connection ends as before supervision.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import select
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from shardfs.app import early, fusedev, peers, state, zygote
from shardfs.app.zygote import Child, Zygote
from shardfs.base import private
from shardfs.kernel import pagetable, wakefd
from shardfs.storage import sharedshards, sharedversions
from shardfs.tree import ledger

log = logging.getLogger("shardfs")
CRASH_LOOP = 5  # worker deaths ...
CRASH_WINDOW = 60.0  # ... within this many seconds end the mount
OOM_SCORE_ADJ = "/proc/self/oom_score_adj"


@dataclass
class Counters:
    """What ``shardfs status`` shows of the supervision (sent to every worker)."""

    pid: int = field(default_factory=os.getpid)
    restarts: int = 0  # workers started after one died
    takeovers: int = 0  # workers started by ``shardfs mount`` on the live mount
    last_reason: str | None = None  # why the last worker ended ("signal 9", "exit status 1")
    deaths: deque[float] = field(default_factory=deque)


@dataclass
class Worker:
    proc: Child
    ctl: socket.socket
    index: int = 0  # its slot (``-o workers=N``: 0 .. N-1)
    started: float = field(default_factory=time.time)
    serving: bool = False
    replaces: bool = False  # its slot had a worker before (the kernel sends again what that one had read)
    waiting: bool = False  # ready, given the connection once FUSE_INIT's bytes are known


class Supervisor:
    """Mount ``mnt`` and keep one worker serving it (see the module docstring).

    ``argv``: the worker's command line, without ``--worker FD``; ``fsname``: the mount's
    source as the mount table shows it; ``fuse_opts``: the libfuse options (``allow_other``,
    ...); ``report``: called once with ``ok`` or ``error: ...`` (the ``--ready-fd`` protocol);
    ``status_path``: the status socket, which this process makes and listens on (so the kernel
    names it as the mount's daemon: ``shardfs.app.mounts.daemon_of``) and each worker serves."""

    def __init__(self, argv: list[str], mnt: str, fsname: str, fuse_opts: list[str], read_only: bool,
                 report: Callable[[str], None], status_path: str | None = None,
                 takeover_path: str | None = None, workers: int = 1, elastic: bool = False,
                 shard_ring: int = 0) -> None:
        self.argv, self.mnt, self.fsname = argv, mnt, fsname
        self.takeover_path = takeover_path  # ``shardfs mount`` on the live mount: the next worker's argv
        self.handing_over: list[str] | None = None  # that argv, while the workers fold and stop
        self.handing: set[int] = set()  # the slots whose worker has not stopped for it yet
        self.status_path = status_path  # ``shardfs status``: made here, served by each worker
        self.status: socket.socket | None = None
        self.fuse_opts, self.read_only = fuse_opts, read_only
        self.report: Callable[[str], None] | None = report
        self.fd = -1
        self.watch: socket.socket | None = None  # fusermount3's auto_unmount socket
        self.init: bytes | None = None
        self.resend = True  # the kernel has FUSE_NOTIFY_RESEND (probed at the mount)
        self.counters = Counters()
        self.count = max(1, workers)  # workers serving at once (``-o workers=N``)
        self.slot_fds: dict[int, int] = {}  # slot -> its device file of the connection (slot 0: ``fd``)
        self.workers: dict[int, Worker] = {}
        self.over = False  # the mount ends: no worker is started again
        self.unmount = False  # ... and is detached once every worker ended
        self.stopping = False
        self.exit_code = 0  # 1: the first worker failed, or a crash loop ended the mount
        self.ledger = ledger.memory()  # the connection's ledger: every worker appends to it
        # what the kernel's page cache holds, for N workers (``shardfs.kernel.pagetable``)
        self.pages = pagetable.memory() if self.count > 1 else None
        # ... and the versions of the source's keys they remember (``shardfs.storage.sharedversions``)
        self.versions = sharedversions.memory() if self.count > 1 else None
        # ... and the shards their homes fetched whole, in a ring of ``shard_ring`` bytes (0: none)
        self.shards = sharedshards.memory(shard_ring) if self.count > 1 and shard_ring else None
        # ``-o workers=auto``: the workers past the first wait on it while the queue is calm
        self.wake = wakefd.wake_fd() if self.count > 1 and elastic else None
        self.oom_before = _protect_from_oom()
        self.zygote: Zygote | None = None  # forks the workers of ``argv`` (``shardfs.app.zygote``)
        self.next_zygote: Zygote | None = None  # ... of ``handing_over``

    def run(self) -> int:
        """Serve until unmounted or signalled; the exit status."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, lambda *_: None)
        try:
            fusedev.check()
            self._listen()
            zygote.prctl(zygote.PR_SET_CHILD_SUBREAPER, 1)  # the zygote's workers are reparented here
            # started by ``python -m shardfs`` before its imports if ``shardfs mount`` spawned this daemon
            self.zygote = early.take(self.argv)
            if self.zygote is not None:
                log.debug("zygote %d started before this daemon's imports", self.zygote.proc.pid)
            else:
                self.zygote = self._zygote(self.argv)
            for index in range(self.count):
                self.workers[index] = self._spawn(index)
        except (fusedev.MountError, OSError) as e:
            self._failed(f"{self.mnt}: cannot mount: {e} (fuse_session_mount failed)"
                         if isinstance(e, fusedev.MountError) else f"cannot start a worker: {e}")
            for w in self.workers.values():
                w.proc.kill()
                w.proc.wait()
            if self.zygote is not None:
                self.zygote.close()
            return self.exit_code
        try:
            while self.workers:
                live = list(self.workers.values())
                # SIGCHLD wakes it: no timer
                ready = select.select([wake_r, *(w.ctl.fileno() for w in live)], [], [])[0]
                if wake_r in ready:
                    self._signals(wake_r)
                for w in live:
                    if w.ctl.fileno() in ready:
                        self._message(w)
                    if w.proc.poll() is not None:
                        self._ended(w)
                self._reap()
            self._unmounted()
        finally:
            for z in (self.zygote, self.next_zygote):
                if z is not None:
                    z.close()
            for fd in self.slot_fds.values():
                if fd != self.fd:
                    os.close(fd)
            if self.fd >= 0:
                os.close(self.fd)
            os.close(self.ledger)
            for table in (self.pages, self.versions, self.shards, self.wake):
                if table is not None:
                    os.close(table)
            if self.workers_path is not None:
                for path in [self.workers_path, *(peers.slot_file(self.workers_path, i) for i in range(self.count))]:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            if self.status is not None and self.status_path is not None:
                self.status.close()
                with contextlib.suppress(OSError):
                    os.unlink(self.status_path)
            if self.watch is not None:
                self.watch.close()
        return self.exit_code

    def _listen(self) -> None:
        if self.status_path is None:
            return
        try:
            self.status = state.status_listener(self.status_path)
        except (OSError, private.Refused) as e:
            log.warning("shardfs status unavailable: cannot make the socket %s: %s", self.status_path,
                        getattr(e, "strerror", None) or e)

    @property
    def workers_path(self) -> str | None:
        """Where the workers of the slots are listed for ``shardfs status`` (beside the socket)."""
        if self.status_path is None:
            return None
        head, _, tail = self.status_path.rpartition("/status-")
        return f"{head}/workers-{tail.removesuffix('.sock')}.json"

    def _list_workers(self) -> None:
        """Write ``workers_path``: each slot's worker (``index``, ``pid``, ``started``)."""
        path = self.workers_path
        if path is None:
            return
        doc = [{"index": w.index, "pid": w.proc.pid, "started": w.started}
               for w in sorted(self.workers.values(), key=lambda w: w.index)]
        peers.write_json(path, doc)

    def _signals(self, wake_r: int) -> None:
        try:
            sigs = os.read(wake_r, 64)
        except BlockingIOError:
            return
        for sig in sigs:
            if sig == signal.SIGUSR1:
                self._takeover()
            elif sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                if sig != signal.SIGHUP:
                    self.stopping = True
                for worker in self.workers.values():
                    if worker.proc.poll() is None:
                        worker.proc.send_signal(signal.SIGTERM if sig != signal.SIGHUP else signal.SIGHUP)

    def _takeover(self) -> None:
        """``shardfs mount`` on the live mount left the next workers' command line
        (``shardfs.app.handover``): each worker folds what is pending and stops (SIGUSR1), then
        ``_ended`` starts that one in its slot (as many workers as before). Only a file of this
        user's own, in a state directory of this user's own, is read (``_own_file``): a command
        line is run from it."""
        if self.takeover_path is None or self.stopping:
            return
        try:
            with open(_own_file(self.takeover_path)) as f:
                argv = json.load(f)["argv"]
            os.unlink(self.takeover_path)
        except (OSError, ValueError, KeyError, TypeError, private.Refused) as e:
            log.error("%s: no takeover: %s", self.takeover_path, e)
            return
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            log.error("%s: no takeover: not a command line", self.takeover_path)
            return
        self.handing_over = argv
        self.handing = set(self.workers)
        if self.next_zygote is not None:
            self.next_zygote.close()
        self.next_zygote = self._zygote(argv)  # imports while the workers fold
        log.info("handing %s over to a new worker: %s", self.mnt, " ".join(argv))
        for worker in self.workers.values():
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGUSR1)

    def _zygote(self, argv: list[str]) -> Zygote | None:
        try:
            return Zygote(argv, {**os.environ, "SHARDFS_OOM_SCORE_ADJ": self.oom_before})
        except OSError as e:
            log.warning("cannot start a zygote (each worker starts afresh): %s", e)
            return None

    def _spawn(self, index: int, argv: list[str] | None = None, replaces: bool = False) -> Worker:
        """A worker for slot ``index``: forked by the zygote of ``argv`` (default: the mount's),
        else (it cannot fork: it died, it cannot import) started afresh, and a new zygote for
        the next one."""
        argv = argv or self.argv
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {"SHARDFS_OOM_SCORE_ADJ": self.oom_before,
               "SHARDFS_WORKER_SLOT": f"{index}/{self.count}" + "/r" * replaces}
        given = {"SHARDFS_LEDGER_FD": self.ledger}  # descriptors it inherits, by the variable naming each
        if self.pages is not None and self.versions is not None:
            given["SHARDFS_PAGES_FD"] = self.pages
            given["SHARDFS_VERSIONS_FD"] = self.versions
        if self.shards is not None:
            given["SHARDFS_SHARDS_FD"] = self.shards
        if self.wake is not None:
            given["SHARDFS_WAKE_FD"] = self.wake
        try:
            handing = self.handing_over is not None and argv is self.handing_over
            z = self.next_zygote if handing else self.zygote
            try:
                if z is None:
                    raise OSError("none")
                proc = z.fork(env, theirs.fileno(), given)
            except OSError as e:
                log.warning("no worker from the zygote (%s): starting one afresh", e)
                if z is not None:
                    z.close()
                if handing:
                    self.next_zygote = self._zygote(argv)
                else:
                    self.zygote = self._zygote(argv)
                proc = zygote.spawn([*argv, "--worker", str(theirs.fileno())],
                                    {**os.environ, **env, **{k: str(v) for k, v in given.items()}},
                                    [theirs.fileno(), *given.values()])
        finally:
            theirs.close()
        return Worker(proc, ours, index, replaces=replaces)

    def _reap(self) -> None:
        """Reap the children that are no worker (a worker's own children, reparented here when it
        died: the supervisor is a subreaper); a dead zygote is noted (the next fork starts another)."""
        known = {w.proc.pid for w in self.workers.values()}
        zygotes = {z.proc.pid: z for z in (self.zygote, self.next_zygote) if z is not None}
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid in known:
                return
            if info.si_pid in zygotes:
                zygotes.pop(info.si_pid).proc.poll()
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)

    def _message(self, worker: Worker) -> None:
        try:
            data = worker.ctl.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            return  # the worker is gone: its status says why
        msg = json.loads(data)
        if "error" in msg:
            self._failed(str(msg["error"]))
        elif msg.get("ready"):
            if worker.index > 0 and self.init is None:
                worker.waiting = True  # the connection once slot 0 answered FUSE_INIT
            else:
                self._give_connection(worker)
        elif "init" in msg:
            self.init = base64.b64decode(msg["init"])
            for other in self.workers.values():
                if other.waiting:
                    other.waiting = False
                    self._give_connection(other)
        elif msg.get("serving"):
            worker.serving = True
            self._list_workers()
            if self.report is not None:
                self.report("ok")
                self.report = None
                log.info("mounted %s on %s%s", self.fsname, self.mnt, " (read-only)" if self.read_only else "")
            log.info("worker %d serves %s", worker.proc.pid, self.mnt)

    def _give_connection(self, worker: Worker) -> None:
        if self.fd < 0:
            try:
                self.fd, self.watch = fusedev.mount(self.mnt, self.fsname, self.fuse_opts, self.read_only)
            except fusedev.MountError as e:
                self._failed(f"{self.mnt}: cannot mount: {e} (fuse_session_mount failed)")  # words as unsupervised
                worker.proc.kill()
                return
            # a probe (nothing is read yet): without it a worker's death must fail what it had read
            self.resend = not os.environ.get("SHARDFS_NO_RESEND") and fusedev.resend(self.fd)
            if not self.resend:
                log.warning("%s: the kernel cannot send a request again (no FUSE_NOTIFY_RESEND, Linux < 6.9): "
                            "the requests a dying worker had read will fail", self.mnt)
            if self.resend:
                try:
                    for index in range(1, self.count):  # kept for the mount's life (see the docstring)
                        self.slot_fds[index] = fusedev.clone(self.fd)
                except OSError as e:
                    self._failed(f"{self.mnt}: cannot clone the FUSE connection for -o workers={self.count}: "
                                 f"{e.strerror}")
                    fusedev.unmount(self.mnt)
                    for w in self.workers.values():
                        w.proc.kill()
                    return
                self.slot_fds[0] = self.fd
        c = self.counters
        status = {"supervisor_pid": c.pid, "restarts": c.restarts, "takeovers": c.takeovers,
                  "last_reason": c.last_reason, "workers_file": self.workers_path}
        msg = {"init": base64.b64encode(self.init).decode() if self.init is not None else None,
               "resend": self.resend, "status": status, "index": worker.index, "count": self.count,
               "replaces": worker.replaces}
        fd = self.slot_fds[worker.index] if self.resend else fusedev.clone(self.fd)
        try:
            socket.send_fds(worker.ctl, [json.dumps(msg).encode()],
                            [fd] + ([self.status.fileno()] if self.status is not None else []))
        finally:
            if not self.resend and fd != self.fd:
                os.close(fd)

    def _failed(self, why: str) -> None:
        """The first worker could not start: report it (a later one: a death like any other)."""
        if self.report is not None:
            self.report(f"error: {why}")
            self.report = None
            self.stopping = True
            self.exit_code = 1
        else:
            log.error("worker failed: %s", why)

    def _ended(self, worker: Worker) -> None:
        """``worker`` ended: another in its slot, unless the mount is over (then the others
        are stopped too)."""
        status = worker.proc.wait()
        worker.ctl.close()
        del self.workers[worker.index]
        if self.wake is not None:
            # the parked workers read the connection: they serve while the slot starts again (the
            # first's may be the one), or find it ended (an unmount) and end
            wakefd.wake(self.wake)
        if self.handing_over is not None and worker.index in self.handing and not self.stopping and self.fd >= 0 \
                and fusedev.connected(self.fd):
            self.handing.discard(worker.index)
            if not self.handing:
                self.argv, self.handing_over = self.handing_over, None
                if self.zygote is not None:
                    self.zygote.close()
                self.zygote, self.next_zygote = self.next_zygote, None
            self.counters.takeovers += worker.index == 0
            log.info("worker %d handed %s over (%s)", worker.proc.pid, self.mnt,
                     "exit status 0" if status == 0 else f"status {status}")
            self.workers[worker.index] = self._spawn(worker.index, self.handing_over or self.argv, replaces=True)
            return
        if self.over or status == 0 or self.stopping or self.fd < 0 or not fusedev.connected(self.fd):
            if not self.over:
                self.over = True
                self.unmount = self.fd >= 0 and (self.stopping or status == 0)
                if status != 0 and self.report is not None:
                    self._failed(f"daemon exited with status {status}")
                # Unmounted: the others see it too and end, the owner of a writable mount's writes
                # once it folded them all (a SIGTERM now would cut that fold short); else they are told.
                if status != 0 or self.stopping or (self.fd >= 0 and fusedev.connected(self.fd)):
                    for other in self.workers.values():
                        if other.proc.poll() is None:
                            other.proc.send_signal(signal.SIGTERM)
            return
        c = self.counters
        c.last_reason = f"signal {-status}" if status < 0 else f"exit status {status}"
        now = time.monotonic()
        c.deaths.append(now)
        while c.deaths and c.deaths[0] < now - CRASH_WINDOW:
            c.deaths.popleft()
        if len(c.deaths) >= CRASH_LOOP:
            log.error("%s: the worker died %d times within %g s (last: %s): unmounting", self.mnt, len(c.deaths),
                      CRASH_WINDOW, c.last_reason)
            fusedev.unmount(self.mnt)
            self.exit_code = 1
            self.over, self.unmount = True, False
            for other in self.workers.values():
                other.proc.kill()
            return
        c.restarts += 1
        log.warning("worker %d ended (%s): starting another on the same connection", worker.proc.pid,
                    c.last_reason)
        self.workers[worker.index] = self._spawn(worker.index, replaces=True)

    def _unmounted(self) -> None:
        """Every worker ended and the mount is over: detach it (unless it is gone already)."""
        if self.unmount:
            fusedev.unmount(self.mnt)
        if self.fd >= 0 and self.exit_code == 0:
            log.info("unmounted %s", self.mnt)


def _protect_from_oom() -> str:
    """Set this process's ``oom_score_adj`` to -1000 (or the lowest value allowed); the value
    it had, for the workers to set back."""
    try:
        with open(OOM_SCORE_ADJ) as f:
            before = f.read().strip()
    except OSError:
        return "0"
    for value in ("-1000", before):
        try:
            with open(OOM_SCORE_ADJ, "w") as f:
                f.write(value)
            break
        except OSError:
            continue
    return before


class Connection:
    """A worker's side of the protocol (see the module docstring): ``fd`` once ``connect``
    returned, ``init`` (None for the first worker), ``status`` (the supervision's counters)."""

    def __init__(self, ctl_fd: int) -> None:
        self.ctl = socket.socket(fileno=ctl_fd)
        os.set_inheritable(ctl_fd, False)
        self.fd = -1
        self.init: bytes | None = None
        self.resend = False
        slot = os.environ.pop("SHARDFS_WORKER_SLOT", "0/1").split("/")
        self.index, self.count = int(slot[0]), int(slot[1])  # this worker's slot of ``count`` (``-o workers``)
        # a worker served this slot before (it died: what it read comes again; its journal is taken over)
        self.replaces = slot[2:] == ["r"]
        self.status: dict[str, Any] = {}
        self.status_socket: socket.socket | None = None  # the supervisor's, for ``shardfs status``
        # the memfd of the connection's ledger (None: a supervisor of an older package, which gives none)
        self.ledger = _given_fd("SHARDFS_LEDGER_FD")
        # the memfds of the page-cache table and of the versions table of N workers (None: one
        # worker, or an older supervisor)
        self.pages = _given_fd("SHARDFS_PAGES_FD")
        self.versions = _given_fd("SHARDFS_VERSIONS_FD")
        self.shards = _given_fd("SHARDFS_SHARDS_FD")  # (a read-only mount of a remote source)
        self.wake = _given_fd("SHARDFS_WAKE_FD")  # ``-o workers=auto`` (``shardfs.kernel.elastic``)
        self.started = time.time()
        parent = os.environ.pop("SHARDFS_SUPERVISOR_PID", None)  # forked by a zygote: reparented to it
        zygote.die_with_parent(int(parent) if parent else None)
        zygote.name("shardfs-worker")
        before = os.environ.pop("SHARDFS_OOM_SCORE_ADJ", None)
        if before is not None:
            try:
                with open(OOM_SCORE_ADJ, "w") as f:
                    f.write(before)
            except OSError:
                pass

    def _send(self, msg: dict[str, Any]) -> None:
        self.ctl.send(json.dumps(msg).encode())

    def error(self, why: str) -> None:
        self._send({"error": why})

    def connect(self) -> None:
        """Say the worker is ready and receive the connection (blocks until the mount exists)."""
        self._send({"ready": True})
        data, fds, _flags, _addr = socket.recv_fds(self.ctl, 1 << 16, 2)
        if not fds:
            sys.exit(1)  # the supervisor could not mount: it reported why
        self.fd = fds[0]
        if len(fds) > 1:
            os.set_inheritable(fds[1], False)
            self.status_socket = socket.socket(fileno=fds[1])
        msg = json.loads(data)
        self.init = base64.b64decode(msg["init"]) if msg["init"] is not None else None
        self.resend = bool(msg["resend"])
        self.status = msg["status"]
        self.replaces = bool(msg.get("replaces", self.init is not None))

    def initialized(self, init: bytes) -> None:
        """The first worker answered the kernel's FUSE_INIT, whose bytes were ``init``."""
        if self.init is None:
            self._send({"init": base64.b64encode(init).decode()})

    def serving(self) -> None:
        self._send({"serving": True})


def _own_file(path: str) -> int:
    """An fd of ``path``, read only if its directory passes ``private``'s check (this user's,
    written by no one else, reached without a symlink from the state home down) and it is a
    regular file of this user's, not a symlink; ``private.Refused`` (or ``OSError``) otherwise."""
    where = os.path.dirname(path)
    dfd = private.open_dir(where, state.private_top(where), create=False)
    try:
        return private.open_file(dfd, os.path.basename(path), os.O_RDONLY, path)
    finally:
        os.close(dfd)


def _given_fd(variable: str) -> int | None:
    """The descriptor the supervisor gave this worker in the environment ``variable`` (taken out
    of it, no longer inherited by its children); None if it gave none."""
    given = os.environ.pop(variable, None)
    if given is None or not given.isdigit():
        return None
    os.set_inheritable(int(given), False)
    return int(given)
