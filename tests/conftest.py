"""Shared fixtures and helpers for the shardfs test suite.

Mounts are real: the daemon runs in its own session (``start_new_session``),
never in the test's trio loop, and every mount is lazily unmounted
(``fusermount3 -u -z``) in teardown even when the test failed. Only processes
the suite started are ever signalled, and only by PID.

Readers:
- ``zarr2(code, **params)`` runs a snippet under zarr-python 2.18 (separate venv; in a child
  of a fork server, tests/zarr2_forks.py, that imported it once);
- ``read_zarr2`` / ``read_zarr3_v2`` / ``read_tensorstore`` read through the mount;
- ``read_native`` / ``read_ts3_native`` are the oracles: zarr-python 3 / tensorstore ``zarr3``
  on the v3 source.

Sources are built by tests/sources.py.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings

REPO = Path(__file__).resolve().parent.parent
# testkit (what the tests and scripts/ share: SeaweedFS, the proxies, source builders), after the
# shardfs that PYTHONPATH names (scripts/mutants)
sys.path.append(str(REPO))
SHARDFS = str(Path(sys.executable).parent / "shardfs")
ZARR2_PYTHON = os.environ.get("SHARDFS_ZARR2_PYTHON") or str(REPO / ".venv-zarr2" / "bin" / "python")
MOUNT_TIMEOUT = 30.0  # a loaded 2-core machine: an s3:// mount imports botocore twice
LOG_SHOWN = 6000  # characters of each daemon's log a failed test's report ends with
EXIT_TIMEOUT = 30  # a daemon folds what is pending before it exits after an unmount: a hang, not a slow fold
# Every daemon the suite starts keeps its state (write journal, log) under this temporary
# XDG_STATE_HOME, never in the user's ~/.local/state; removed at exit.
STATE_HOME = tempfile.mkdtemp(prefix="shardfs-state-")
os.environ["XDG_STATE_HOME"] = STATE_HOME
atexit.register(shutil.rmtree, STATE_HOME, ignore_errors=True)
# ... and counts 2 cores (``-o workers=auto``, the default, is then one worker on any machine, as
# on CI's; a test of more workers asks for them, or for more cores: tests/test_elastic.py)
os.environ.setdefault("SHARDFS_TEST_CORES", "2")

# Object-store servers: ``s3`` (SeaweedFS, tests/s3server.py), ``azure`` (Azurite, tests/azserver.py);
# ``source`` (tests/source_kinds.py): a test over a local directory and over an s3:// bucket.
pytest_plugins = ["s3server", "azserver", "source_kinds", "webserver", "awshome"]


# --------------------------------------------------------------------------- hypothesis

# ``ci`` (the default): the same examples on every run (derandomized, no example database),
# with the budgets the tests ask for. ``thorough`` (SHARDFS_HYPOTHESIS=thorough): random
# examples, THOROUGH_FACTOR times the budget, failures remembered in .hypothesis/.
# ``mutants`` (set by scripts/mutants): ``ci`` without shrinking, a failure is all it needs.
HYPOTHESIS_PROFILE = os.environ.get("SHARDFS_HYPOTHESIS", "ci")
THOROUGH_FACTOR = 10
_COMMON: dict[str, Any] = dict(deadline=None, print_blob=True,
                               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile("thorough", derandomize=False, **_COMMON)
settings.register_profile("mutants", derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate], **_COMMON)
if HYPOTHESIS_PROFILE not in ("ci", "thorough", "mutants"):
    raise pytest.UsageError(f"SHARDFS_HYPOTHESIS={HYPOTHESIS_PROFILE}: use 'ci' or 'thorough'")
settings.load_profile(HYPOTHESIS_PROFILE)


def budget(examples: int) -> int:
    """``max_examples`` for a property test: ``examples`` under the ci profile, more when thorough."""
    return examples * THOROUGH_FACTOR if HYPOTHESIS_PROFILE == "thorough" else examples


# --------------------------------------------------------------------------- mounts


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def is_mounted(mnt) -> bool:
    """True if ``mnt`` is in the mount table (unlike ``os.path.ismount``, also for a
    dead FUSE mount whose stat fails with ENOTCONN). Never a stat of ``mnt`` itself (only its
    parent is resolved): a wedged daemon would never answer it."""
    target = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(mnt))), os.path.basename(mnt))
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)
            if point == target:
                return True
    return False


def lazy_unmount(mnt) -> None:
    """``fusermount3 -u -z MNT`` if anything (even a dead FUSE mount) is mounted there."""
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=30)


class Mount:
    """One daemon started by the suite (``shardfs mount SRC MNT -f --debug``), run under
    ``prefix`` (e.g. ``strace ...``) when given: ``pid`` is then the prefix command's.
    ``src`` is a directory or an object-store URL (a ``str``, kept as given); ``env`` is
    added to the daemon's environment (an object store's credentials)."""

    def __init__(self, src: Path | str, mnt: Path, log: Path, extra: tuple[str, ...], allow_traceback: bool,
                 prefix: tuple[str, ...] = (), env: dict[str, str] | None = None):
        self.src = src if "://" in str(src) else Path(src)
        self.mnt, self.log, self.allow_traceback = mnt, log, allow_traceback
        self.stdout = log.with_suffix(".stdout")
        self.stderr = log.with_suffix(".stderr")
        cmd = [*prefix, SHARDFS, "mount", str(self.src), str(mnt), "-f", "--debug", "--log-file", str(log), *extra]
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **(env or {})})

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def serving_pid(self) -> int:
        """The process that serves the mount's requests: of a supervised mount its worker (what
        memory, I/O and file descriptors are measured on), else the daemon."""
        return serving_pid(self.mnt)

    def output(self) -> str:
        """Everything the daemon wrote: log file, stdout and stderr."""
        parts = []
        for p in (self.log, self.stdout, self.stderr):
            try:
                parts.append(p.read_text(errors="replace"))
            except FileNotFoundError:
                pass
        return "\n".join(parts)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_live(self) -> None:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while time.monotonic() < deadline:
            if os.path.ismount(self.mnt):
                return
            if self.proc.poll() is not None:
                pytest.fail(
                    f"shardfs mount {self.src} exited with {self.proc.returncode} before the mount "
                    f"was live:\n{self.output()[-5000:]}"
                )
            time.sleep(0.05)
        pytest.fail(f"shardfs mount {self.src} not live after {MOUNT_TIMEOUT}s:\n{self.output()[-5000:]}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def teardown(self) -> str | None:
        """Unmount, reap (SIGKILL by PID if needed); return an error message or None."""
        problems = []
        lazy_unmount(self.mnt)
        try:
            self.proc.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            problems.append(f"daemon pid {self.pid} still alive {EXIT_TIMEOUT} s after unmount; killed")
            os.killpg(self.pid, signal.SIGKILL)  # its session: the supervisor and its workers
            self.proc.wait(timeout=10)
        if is_mounted(self.mnt):
            problems.append(f"{self.mnt} still mounted after fusermount3 -u -z")
        if not self.allow_traceback and "Traceback" in self.output():
            problems.append(f"daemon output contains a Traceback:\n{self.output()[-8000:]}")
        return "\n".join(problems) or None


def traced_daemon(mount_info: Mount) -> int:
    """The shardfs process of a mount started with a ``prefix`` command (e.g. strace): its only child."""
    children = Path(f"/proc/{mount_info.pid}/task/{mount_info.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


class MountFactory:
    """``mount(src, *extra_args, allow_traceback=False, prefix=(), env=None) -> Path`` (the live
    mountpoint); ``src`` a directory or an object-store URL, ``env`` added to the daemon's.

    ``factory.info(mnt)`` gives the ``Mount`` (pid, log) behind a mountpoint.
    """

    def __init__(self, tmp_factory: pytest.TempPathFactory):
        self._tmp = tmp_factory
        self._mounts: list[Mount] = []

    def __call__(self, src, *extra_args: str, allow_traceback: bool = False, prefix: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> Path:
        base = self._tmp.mktemp("mount")
        mnt = base / "mnt"
        mnt.mkdir()
        m = Mount(src, mnt, base / "daemon.log", tuple(extra_args), allow_traceback, tuple(prefix), env)
        self._mounts.append(m)
        m.wait_live()
        return mnt

    def mounts(self) -> list[Mount]:
        """The mounts started and not yet torn down, oldest first."""
        return list(self._mounts)

    def info(self, mnt: Path) -> Mount:
        for m in self._mounts:
            if m.mnt == Path(mnt):
                return m
        raise KeyError(mnt)

    def close(self) -> None:
        problems = []
        while self._mounts:
            m = self._mounts.pop()
            try:
                p = m.teardown()
            except Exception as e:  # keep tearing down the others
                p = f"teardown of {m.mnt} failed: {e!r}"
            if p:
                problems.append(p)
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def mount(tmp_path_factory):
    factory = MountFactory(tmp_path_factory)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def mnt(module_mount, src) -> Path:
    """The module's ``src`` (a module-scoped fixture of the test module's) mounted once for the module."""
    return module_mount(src)


@pytest.fixture(scope="module")
def tree(src) -> Iterator[Any]:
    """The module's ``src`` as the mount shows it, in-process (``inproc.InProcess``: no kernel)."""
    from inproc import InProcess

    with InProcess(src) as fs:
        yield fs


@pytest.fixture(scope="module")
def module_mount(tmp_path_factory):
    """Like ``mount`` but torn down at the end of the module (one mount per module)."""
    factory = MountFactory(tmp_path_factory)
    yield factory
    factory.close()


_LOCKER = r"""
import fcntl, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o666)
fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
print("locked", flush=True)
time.sleep(3600)
"""


@contextlib.contextmanager
def shard_locks(*shards: Path) -> Iterator[list[subprocess.Popen]]:
    """tensorstore's lock file of each of ``shards`` (``SHARD.__lock``, an OFD write lock) held
    by a process of its own, each holding it once this is entered, until the block ends (or the
    test kills a locker it is given earlier): no fold of those shards meanwhile."""
    lockers = [subprocess.Popen([sys.executable, "-c", _LOCKER, f"{shard}.__lock"], stdout=subprocess.PIPE,
                                text=True, start_new_session=True) for shard in shards]
    try:
        for locker in lockers:
            assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        yield lockers
    finally:
        for locker in lockers:
            locker.kill()
            locker.wait()


# Tests that drop the kernel's caches (``drop_caches``) and those that must see a mount idle
# (``quiet_caches``) take this lock: a drop sends a FORGET burst to every mount of the machine,
# including other test processes' (found: an idle mount's worker woken 117 times in 3 s).
DROP_LOCK = os.path.join(tempfile.gettempdir(), "shardfs-tests-drop-caches.lock")


def _drop_lock(how: int) -> int:
    fd = os.open(DROP_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, how)
    return fd


def drop_caches(what: str) -> None:
    """Write ``what`` to /proc/sys/vm/drop_caches ("1": pages, "2": dentries and inodes, whose
    FORGETs reach every mount, "3": both), never inside another test's ``quiet_caches``; returns
    once the mounts had time to take the FORGETs."""
    fd = _drop_lock(fcntl.LOCK_SH)
    try:
        Path("/proc/sys/vm/drop_caches").write_text(what)
        time.sleep(0.2)
    finally:
        os.close(fd)


@contextlib.contextmanager
def quiet_caches() -> Iterator[None]:
    """No test drops the kernel's caches meanwhile (``drop_caches`` waits until the end)."""
    fd = _drop_lock(fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)


def wait_for(cond, seconds: float, what: str) -> None:
    """Poll ``cond`` until it is true; AssertionError naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.1)


def folded(mnt: Path, seconds: float = 60) -> None:
    """Wait until the mount at ``mnt`` has no pending chunk: what was written through it is in
    its shards, for a reader of the source. (A shard is folded in the background, after its last
    chunk's write returned: reading the source straight after a writer exits races the fold.)"""
    from shardfs.app.status_client import status_of

    def none_pending() -> bool:
        doc: dict[str, Any] = dict(status_of(str(mnt)))
        return bool(doc["pending"]["chunks"] == 0)

    wait_for(none_pending, seconds, f"every chunk written to {mnt} folded")


FS_TIMEOUT = 30.0  # a call on a mount that a loaded machine answers in far less
_LEFT_BEHIND: list[int] = []  # children of ``bounded`` that did not answer (reaped when they end)


def _reap_left_behind() -> None:
    for pid in list(_LEFT_BEHIND):
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                _LEFT_BEHIND.remove(pid)
        except ChildProcessError:
            _LEFT_BEHIND.remove(pid)


def bounded(fn, *args, seconds: float = FS_TIMEOUT, fd: bool = False):
    """``fn(*args)`` run in a forked child: its result, or the exception it raised (re-raised
    here); an AssertionError if it has not answered within ``seconds``. For calls on a mount
    that a wedged daemon may never answer: a FUSE request the daemon has read keeps its caller
    in uninterruptible sleep (SIGKILL waits too) until it is answered or the connection ends, so
    such a call in the test process would hang the suite (the child is SIGKILLed and left
    behind: it ends with the mount's connection, at teardown). The child shares the test's open
    files (and their offsets); its exit closes its copies of them, which sends a FLUSH for every
    file on a mount opened without ``noflush`` (for writing): open those after. ``fd=True``:
    ``fn`` returns a file descriptor (``os.open``), passed back to the caller (the same open file)."""
    import pickle
    import socket
    import warnings

    _reap_left_behind()
    ours, theirs = socket.socketpair()
    with warnings.catch_warnings():  # (zarr's I/O thread: fork only runs fn and _exit)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            ours.close()
            try:
                got, out = fn(*args), True
            except BaseException as e:  # noqa: BLE001 - every outcome goes back to the caller
                got, out = e, False
            fds = [got] if fd and out else []
            data = pickle.dumps((out, None if fds else got))
            socket.send_fds(theirs, [len(data).to_bytes(8, "little") + data], fds)
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    theirs.close()
    try:
        ours.settimeout(seconds)
        deadline = time.monotonic() + seconds
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ours, 1 << 16, 1)
            while len(msg) < 8 or len(msg) < 8 + int.from_bytes(msg[:8], "little"):
                ours.settimeout(max(0.01, deadline - time.monotonic()))
                more = ours.recv(1 << 20)
                if not more:
                    raise AssertionError(f"{getattr(fn, '__name__', fn)}{args}: the child ended without an answer")
                msg += more
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            _LEFT_BEHIND.append(pid)
            raise AssertionError(f"{getattr(fn, '__name__', fn)}{args}: not answered within {seconds} s "
                                 "(a request the daemon never answers)") from None
    finally:
        ours.close()
    _LEFT_BEHIND.append(pid)  # (it may still be closing its copies of the test's files: never waited for)
    _reap_left_behind()
    out, got = pickle.loads(msg[8:8 + int.from_bytes(msg[:8], "little")])
    if not out:
        raise got
    return fds[0] if fd else got


def run_shardfs(*args: str, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([SHARDFS, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


def status(mnt: Path) -> dict:
    """What ``shardfs status MNT --json`` prints, asked in this process (the command's own
    ``status_of``: 0.15 s of CPU less than running it); AssertionError if it would refuse."""
    from shardfs.app.status_client import StatusError, status_of

    try:
        return json.loads(json.dumps(status_of(str(mnt))))
    except StatusError as e:
        raise AssertionError(str(e)) from None


# --------------------------------------------------------------------------- zarr 2.18

_ZARR2_PRELUDE = """
import json, sys
import numpy as np
import zarr
params = json.loads(sys.argv[1])
globals().update(params)
"""

_ZARR2_EPILOGUE = """
_out = sys.argv[2]
if isinstance(result, dict):
    _arrays = {k: v for k, v in result.items() if isinstance(v, np.ndarray)}
    _other = {k: v for k, v in result.items() if not isinstance(v, np.ndarray)}
    _keys = list(_arrays)
    np.savez(_out + ".npz", **{"a%d" % i: _arrays[k] for i, k in enumerate(_keys)})
    with open(_out + ".json", "w") as f:
        json.dump({"keys": _keys, "other": _other}, f)
else:
    np.save(_out + ".npy", np.asarray(result), allow_pickle=False)
"""


class _Zarr2Forks:
    """This process's fork server of zarr 2.18 snippets (tests/zarr2_forks.py), started on first
    use; it ends when this process does (its standard input is a pipe from here)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._owner = 0
        self._socket = ""
        self._lock = threading.Lock()  # (a test's threads may run their first snippets at once)

    def address(self) -> str:
        with self._lock:
            return self._started()

    def _started(self) -> str:
        if self._proc is None or self._owner != os.getpid() or self._proc.poll() is not None:
            home = tempfile.mkdtemp(prefix="zarr2-forks-")
            atexit.register(shutil.rmtree, home, ignore_errors=True)
            self._socket = os.path.join(home, "socket")
            # one BLAS thread: a forked child must not need the threads of its parent
            self._proc = subprocess.Popen([ZARR2_PYTHON, str(Path(__file__).parent / "zarr2_forks.py"), self._socket],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
            self._owner = os.getpid()
            assert self._proc.stdout is not None and self._proc.stdout.readline() == "ready\n"
        return self._socket

    def run(self, argv: list[str], output: str, timeout: float) -> int:
        """``python -c`` with ``argv`` (the program and its arguments) in a child of the server,
        its stdout and stderr in ``output``: its exit status; ``subprocess.TimeoutExpired`` (the
        child SIGKILLed) after ``timeout`` seconds."""
        request = {"prog": argv[0], "argv": argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "output": output}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(self.address())
            conn.sendall(json.dumps(request).encode() + b"\n")
            replies = conn.makefile("rb")
            pid = int(replies.readline())
            try:
                code = replies.readline()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(["zarr2 snippet"], timeout) from None
        return int(code) if code else -signal.SIGKILL  # (no status: the child was killed)


_ZARR2_FORKS = _Zarr2Forks()


def zarr2(code: str, timeout: float = 300, **params):
    """Run ``code`` under zarr-python 2.18 (in a child of a fork server that has imported it); it
    gets ``params`` as globals and sets ``result``.

    ``result`` may be an ndarray (returned as is) or a dict whose ndarray values come
    back as ndarrays and whose other (JSON) values come back unchanged.
    """
    with tempfile.TemporaryDirectory(prefix="zarr2-") as d:
        out = os.path.join(d, "out")
        prog = _ZARR2_PRELUDE + textwrap.dedent(code) + _ZARR2_EPILOGUE
        returncode = _ZARR2_FORKS.run([prog, json.dumps(params), out], os.path.join(d, "output"), timeout)
        if returncode != 0:
            output = Path(d, "output").read_text(errors="replace")
            raise AssertionError(f"zarr 2 snippet failed ({returncode}):\n{output[-5000:]}")
        if os.path.exists(out + ".npy"):
            return np.load(out + ".npy", allow_pickle=False)
        with open(out + ".json") as f:
            meta = json.load(f)
        res = dict(meta["other"])
        with np.load(out + ".npz", allow_pickle=False) as z:
            for i, k in enumerate(meta["keys"]):
                res[k] = z[f"a{i}"]
        return res


def read_zarr2(path) -> np.ndarray:
    return zarr2("result = zarr.open(path, mode='r')[...]", path=str(path))


def read_zarr2_many(paths) -> dict:
    """Read many arrays with zarr 2.18 in ONE subprocess: ``{path: ndarray | 'error: ...'}``."""
    return zarr2(
        """
        result = {}
        for p in paths:
            try:
                result[p] = zarr.open(p, mode='r')[...]
            except Exception as e:
                result[p] = "error: %s: %s" % (type(e).__name__, e)
        """,
        paths=[str(p) for p in paths],
    )


# --------------------------------------------------------------------------- zarr 3 / tensorstore


def read_zarr3_v2(path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(path), mode="r", zarr_format=2)[...])


def read_tensorstore(path) -> np.ndarray:
    import tensorstore as ts

    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}}
    # A fresh context per read: no cache shared between reads.
    return ts.open(spec, read=True, context=ts.Context()).result().read().result()


def read_native(src_path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(src_path), mode="r")[...])


def read_ts3_native(src_path) -> np.ndarray:
    """The other oracle: tensorstore's ``zarr3`` driver on the v3 source (strict about corrupt shards)."""
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(src_path)}}
    return ts.open(spec, read=True, context=ts.Context()).result().read().result()


def assert_same_array(actual, expected, what: str = "") -> None:
    """Equal shape, dtype (kind and size; byte order may differ) and values (NaN == NaN)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert (actual.dtype.kind, actual.dtype.itemsize) == (expected.dtype.kind, expected.dtype.itemsize), (
        f"{what}: dtype {actual.dtype.str} != {expected.dtype.str}"
    )
    np.testing.assert_array_equal(actual, expected, err_msg=what, strict=False)


# --------------------------------------------------------------------------- datasets


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "transcode: array whose inner chain v2 cannot express (served transcoded)")
    config.addinivalue_line(
        "markers", "long(seconds): a module that takes a minute or more, the seconds it took in a scripts/test "
                   "run (3 processes on 2 cores): run first, longest first, so that a parallel run does not end "
                   "waiting on it")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with the log of each daemon its ``mount`` fixture started
    (the last ``LOG_SHOWN`` characters each): a rare failure of a CI run is then understood
    from its output, the mounts' state directories being gone with the run."""
    outcome = yield
    rep = outcome.get_result()
    factory = getattr(item, "funcargs", {}).get("mount")
    if rep.failed and isinstance(factory, MountFactory):
        for m in factory.mounts():
            rep.sections.append((f"daemon log of {m.mnt}", m.output()[-LOG_SHOWN:]))


def pytest_collection_modifyitems(items):
    """Modules marked ``long`` first, longest first, each kept whole and in order: ``scripts/test``
    hands whole modules to its processes in this order, and a long one started last would end the
    run alone."""
    def seconds(item: pytest.Item) -> float:
        mark = item.get_closest_marker("long")
        return mark.args[0] if mark is not None else 0.0

    items.sort(key=seconds, reverse=True)


def case_params(cases):
    """pytest params with readable ids; transcoded cases carry the ``transcode`` mark."""
    return [pytest.param(c, id=c.id, marks=[] if c.passthrough else [pytest.mark.transcode]) for c in cases]


class Matrix:
    """The read matrix source: ``root`` (v3 hierarchy) and ``data[case.id]`` (what was written)."""

    def __init__(self, root: Path, data: dict):
        self.root, self.data = root, data


@pytest.fixture(scope="session")
def matrix(tmp_path_factory) -> Matrix:
    from sources import build_matrix

    root = tmp_path_factory.mktemp("matrix") / "src"
    return Matrix(root, build_matrix(root))


def daemon_pids(mnt: Path) -> list[int]:
    """PIDs of shardfs processes serving ``mnt`` (a unique tmp path: only ones this test started)."""
    needle = str(mnt).encode()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in argv and any(b"shardfs" in a for a in argv):
            pids.append(int(d))
    return pids


def open_files(pid: int) -> list[str]:
    """What each open descriptor of process ``pid`` names (``/proc/PID/fd``; one closed meanwhile
    left out)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return found


def is_worker(pid: int) -> bool:
    """A supervised mount's worker: named so (a worker forked by the zygote has its command line)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "shardfs-worker"
    except OSError:
        return False


def serving_pids(mnt: Path) -> list[int]:
    """The shardfs processes that serve ``mnt``'s requests: of a supervised mount its workers
    (``is_worker``; N of them with ``-o workers=N``), else the only daemon."""
    pids = daemon_pids(mnt)
    workers = [p for p in pids if is_worker(p)]
    if workers:
        return workers
    (pid,) = pids
    return [pid]


def serving_pid(mnt: Path) -> int:
    """The one shardfs process that serves ``mnt``'s requests (a mount with ``-o workers=1``:
    a test of one process's memory, descriptors or wake-ups), else ``serving_pids``."""
    pids = serving_pids(mnt)
    assert len(pids) == 1, f"{len(pids)} workers serve {mnt}: mount it with -o workers=1"
    return pids[0]


@pytest.fixture
def mnt_dir(tmp_path):
    """A mountpoint for tests that run the CLI themselves: unmounted and its daemons gone at
    the end (SIGKILL by PID after EXIT_TIMEOUT), whatever happened."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield mnt
    lazy_unmount(mnt)
    deadline = time.monotonic() + EXIT_TIMEOUT
    while daemon_pids(mnt) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in daemon_pids(mnt):
        os.kill(pid, signal.SIGKILL)
