"""Other local users (doc/SECURITY.md): what they plant is never used, what they may not read
they cannot read through a mount, what they name cannot forge output.

A session fixture makes an unprivileged local user (``other_user``: ``useradd``, removed at the
end; reused if it exists) that plants state, journals, logs and caches in shared places (a
sticky, world-writable directory standing in for ``/tmp``, a source whose top directory it may
write) before the suite's user (root) mounts. Each test reproduces one finding of issue 36 and
asserts the exact outcome: one line naming what is refused, and nothing planted used.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import lazy_unmount, read_zarr2, run_shardfs, serving_pids, wait_for
from shardfs.app import state
from shardfs.writes.journal import Change, Journal, encode_record
from sources import Spec, assert_source_equals, build
from writers import umount

OTHER = "shardfs-other"
HINT = "not used: it must be this user's own, not a symlink, writable by no one else"
S = Spec("s", (8, 10), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
         index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 10)),),
         write=(slice(0, 4), slice(0, 5)))


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def run(self, *argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` as this user (``setpriv``: no supplementary groups, its own uid and gid)."""
        cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=check, **kw)

    def sh(self, script: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run("/bin/sh", "-c", script, check=check)

    def write(self, path: Path, data: bytes) -> None:
        """As this user: make ``path``'s missing directories and write ``data`` to it."""
        cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--", "/bin/sh", "-c",
               'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", str(path)]
        subprocess.run(cmd, input=data, capture_output=True, timeout=60, check=True)


@pytest.fixture(scope="session")
def other_user():
    """An unprivileged local user (made with ``useradd`` unless it exists; removed at the end
    if this fixture made it). Skips unless the suite runs as root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a second user")
    try:
        entry = pwd.getpwnam(OTHER)
        made = False
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER],
                       check=True, capture_output=True)
        entry = pwd.getpwnam(OTHER)
        made = True
    yield User(OTHER, entry.pw_uid, entry.pw_gid)
    if made:
        subprocess.run(["userdel", OTHER], capture_output=True)


@pytest.fixture
def shared():
    """A directory every user may write, sticky like ``/tmp`` (removed at the end)."""
    d = Path(tempfile.mkdtemp(prefix="shardfs-shared-"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def refused(path, why: str) -> str:
    return f"{path}: {why}: {HINT}"


def foreign(user: User) -> str:
    return f"owned by uid {user.uid}, not by this user (uid 0)"


def mount_fails(src: Path, mnt: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    """``shardfs mount SRC MNT ...`` that must fail: its stderr (exit status 1 asserted)."""
    try:
        r = run_shardfs("mount", str(src), str(mnt), *extra, env={**os.environ, **(env or {})})
    finally:
        lazy_unmount(mnt)
    assert r.returncode == 1, (r.returncode, r.stderr)
    return r.stderr


SEGMENT = f"{0:020d}.seg"


def plant_journal(user: User, journal_root: Path, value: np.ndarray) -> None:
    """As ``user``: an orphan daemon journal under ``journal_root`` holding chunk (0, 0) = ``value``."""
    user.write(journal_root / f"{1:020d}-1" / SEGMENT, encode_record(Change("s", (0, 0), 0, S.encode(value))))


# --------------------------------------------------------------------------- journals


def test_a_journal_planted_in_the_source_is_not_replayed(tmp_path, shared, other_user, mount):
    """Finding 1: ``SRC/.shardfs/journal`` planted by a user who may write the source's top
    directory is not replayed into the root-owned shard (one log line), and not removed."""
    src = shared / "src"
    exp = build(src, [S])["s"]
    src.chmod(0o777)
    other_user.write(src / ".shardfs" / "journal" / SEGMENT,
                     encode_record(Change("s", (0, 0), 0, S.encode(S.values(S.chunk, 9)))))
    mnt = mount(src)
    log = mount.info(mnt).log_text()
    journal = f"{src}/.shardfs/journal"
    assert f"{journal}: not replayed: {refused(src, 'writable by its group or others (mode 0777)')}" in log, log
    assert "replayed" not in log.replace(f"{journal}: not replayed", "")
    np.testing.assert_array_equal(read_zarr2(mnt / "s"), exp)
    umount(mount, mnt)
    assert_source_equals(src, "s", exp)
    assert os.listdir(src / ".shardfs" / "journal") == [SEGMENT]


def test_a_legacy_journal_behind_a_symlink_deletes_nothing(tmp_path, mount):
    """Finding 1: ``SRC/.shardfs`` a symlink: nothing it leads to is replayed or removed."""
    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    outside = tmp_path / "outside"
    Journal(str(outside / "journal")).append(Change("s", (0, 0), 0, S.encode(S.values(S.chunk, 9))))
    (src / ".shardfs").symlink_to(outside)
    mnt = mount(src)
    log = mount.info(mnt).log_text()
    assert f"{src}/.shardfs/journal: not replayed: {refused(f'{src}/.shardfs', 'a symlink')}" in log, log
    umount(mount, mnt)
    assert_source_equals(src, "s", exp)
    assert os.listdir(outside / "journal") == [SEGMENT]


def test_a_state_dir_another_user_made_is_refused(tmp_path, shared, other_user):
    """Finding 1: ``$XDG_STATE_HOME/shardfs/<id>`` made beforehand by another user (the id is
    computable by anyone), holding an orphan journal: the writable mount is refused with one
    line naming it; nothing is replayed."""
    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    home = shared / "state"
    other_user.sh(f"mkdir -p '{home}/shardfs' && chmod 755 '{home}' '{home}/shardfs'")
    ident = state.source_id(str(src))
    plant_journal(other_user, home / "shardfs" / ident / "journal", S.values(S.chunk, 9))
    err = mount_fails(src, tmp_path / "mnt", env={"XDG_STATE_HOME": str(home)})
    uid = other_user.uid
    assert err == f"shardfs: error: {refused(home / 'shardfs', f'owned by uid {uid}, not by this user (uid 0)')}\n"
    assert_source_equals(src, "s", exp)


def test_a_journal_dir_another_user_made_is_refused(tmp_path, shared, other_user):
    """Finding 1: ``-o journal_dir=DIR`` made by another user, holding an orphan journal."""
    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    jdir = shared / "j"
    plant_journal(other_user, jdir, S.values(S.chunk, 9))
    err = mount_fails(src, tmp_path / "mnt", "-o", f"journal_dir={jdir}")
    assert err == f"shardfs: error: {refused(jdir, f'owned by uid {other_user.uid}, not by this user (uid 0)')}\n"
    assert_source_equals(src, "s", exp)


def test_a_journal_dir_others_can_write_or_a_symlink_is_refused(tmp_path):
    src = tmp_path / "src"
    build(src, [S])
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o775)
    err = mount_fails(src, tmp_path / "mnt", "-o", f"journal_dir={open_dir}")
    assert err == f"shardfs: error: {refused(open_dir, 'writable by its group or others (mode 0775)')}\n"
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    err = mount_fails(src, tmp_path / "mnt", "-o", f"journal_dir={tmp_path / 'link'}")
    assert err == f"shardfs: error: {refused(tmp_path / 'link', 'a symlink')}\n"
    assert os.listdir(tmp_path / "elsewhere") == []


def test_a_sticky_journal_dir_is_used_and_what_others_plant_in_it_is_not(tmp_path, shared, other_user, mount):
    """``-o journal_dir=DIR`` may be a sticky directory others write, of this user's or root's
    (a fresh tmpfs is 1777, as ``/tmp``): the journal is made in it 0700; an orphan journal
    another user planted there refuses the mount, naming it; a sticky one of theirs is refused."""
    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    jdir = shared / "sticky"
    jdir.mkdir()
    jdir.chmod(0o1777)
    plant_journal(other_user, jdir, S.values(S.chunk, 9))
    err = mount_fails(src, tmp_path / "mnt", "-o", f"journal_dir={jdir}")
    why = f"{jdir}: not journal directories: {1:020d}-1"
    assert err == f"shardfs: error: {src}: cannot replay the write journal: {why}\n", err
    assert_source_equals(src, "s", exp)
    shutil.rmtree(jdir / f"{1:020d}-1")
    mnt = mount(src, "-o", f"journal_dir={jdir}")
    (mnt / "s" / "0.0").write_bytes(S.encode(S.values(S.chunk, 5)))
    (own,) = os.listdir(jdir)
    assert os.lstat(jdir / own).st_mode & 0o7777 == 0o700
    umount(mount, mnt)
    theirs = shared / "theirs"
    theirs.mkdir()
    theirs.chmod(0o1777)
    os.chown(theirs, other_user.uid, other_user.gid)
    err = mount_fails(src, tmp_path / "mnt", "-o", f"journal_dir={theirs}")
    assert err == f"shardfs: error: {refused(theirs, foreign(other_user))}\n", err


def test_state_dirs_and_files_are_private(tmp_path, mount, shared):
    """Every directory shardfs makes is 0700 and its files 0600 (journal segment, socket, log)."""
    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    home = shared / "home"  # a short path: a unix socket's is at most 107 bytes
    mnt = mount(src, env={"XDG_STATE_HOME": str(home)})
    (mnt / "s" / "0.0").write_bytes(S.encode(S.values(S.chunk, 5)))
    sdir = home / "shardfs" / state.source_id(str(src))
    wait_for(lambda: any(n.endswith(".sock") for n in os.listdir(sdir)), 10, "the status socket")
    modes = {os.path.relpath(os.path.join(d, n), home): os.lstat(os.path.join(d, n)).st_mode & 0o777
             for d, dirs, files in os.walk(home) for n in dirs + files}
    assert {m for m in modes.values()} <= {0o700, 0o600}, modes
    assert modes[os.path.relpath(sdir / "spill", home)] == 0o700
    assert any(name.endswith(".sock") for name in modes), modes
    umount(mount, mnt)
    exp[S.chunk_region((0, 0))] = S.values(S.chunk, 5)
    assert_source_equals(src, "s", exp)


# --------------------------------------------------------------------------- logs


def test_a_log_file_symlink_in_a_sticky_dir_is_refused(tmp_path, shared, other_user):
    """Finding 2: ``--log-file`` in a sticky directory where another user planted a symlink to a
    file only root may write: refused with one line; the file is untouched."""
    src = tmp_path / "src"
    build(src, [S])
    secret = tmp_path / "root-only"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    other_user.sh(f"ln -s '{secret}' '{shared}/shardfs.log'")
    err = mount_fails(src, tmp_path / "mnt", "--log-file", str(shared / "shardfs.log"), "--read-only")
    assert err == f"shardfs: error: {refused(shared / 'shardfs.log', 'a symlink')}\n"
    assert secret.read_text() == "root's\n"


def test_a_log_file_another_user_made_is_refused(tmp_path, shared, other_user):
    """Finding 2: a ``--log-file`` another user created beforehand (to read root's log)."""
    src = tmp_path / "src"
    build(src, [S])
    other_user.sh(f"touch '{shared}/shardfs.log' && chmod 666 '{shared}/shardfs.log'")
    err = mount_fails(src, tmp_path / "mnt", "--log-file", str(shared / "shardfs.log"), "--read-only")
    assert err == f"shardfs: error: {refused(shared / 'shardfs.log', foreign(other_user))}\n"
    assert (shared / "shardfs.log").read_text() == ""


def test_the_state_log_symlink_is_refused(tmp_path, shared, other_user):
    """Finding 2: no syslog, a state directory another user made with a ``log`` symlink to a
    root-only file: the read-only mount is refused naming the state directory."""
    if os.path.exists("/dev/log"):
        pytest.skip("syslog present: the daemon does not log to the state directory")
    src = tmp_path / "src"
    build(src, [S])
    secret = tmp_path / "root-only"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    home = shared / "state"
    sdir = home / "shardfs" / state.source_id(str(src))
    other_user.sh(f"mkdir -p '{sdir}' && chmod -R 755 '{home}' && ln -s '{secret}' '{sdir}/log'")
    err = mount_fails(src, tmp_path / "mnt", "--read-only", env={"XDG_STATE_HOME": str(home)})
    uid = other_user.uid
    assert err == f"shardfs: error: {refused(home / 'shardfs', f'owned by uid {uid}, not by this user (uid 0)')}\n"
    assert secret.read_text() == "root's\n"


# --------------------------------------------------------------------------- caches


def test_a_cache_dir_another_user_made_is_refused_and_own_files_are_private(tmp_path, shared, other_user):
    """Finding 3: ``-o cache_dir`` another user made (with planted entries) is refused with one
    line; the user's own is made 0700 with 0600 files; a file in it that is not the user's own
    is never served (removed, one log line)."""
    from shardfs.reads.rangecache import RangeCache
    from shardfs.storage import Version

    other_user.sh(f"mkdir '{shared}/cache'")
    with pytest.raises(ValueError) as e:
        RangeCache(1 << 20, str(shared / "cache"))
    assert str(e.value) == f"cache_dir {refused(shared / 'cache', foreign(other_user))}"
    own = tmp_path / "cache"
    v = Version("etag", 8, 1)
    cache = RangeCache(0, str(own))
    cache.put("s3://b/k", v, 0, b"12345678")
    cache.flush()
    files = [os.path.join(d, n) for d, _, names in os.walk(own) for n in names]
    dirs = [os.path.join(d, n) for d, names, _ in os.walk(own) for n in names]
    assert (own.stat().st_mode & 0o777, {os.stat(d).st_mode & 0o777 for d in dirs}) == (0o700, {0o700})
    assert {os.stat(f).st_mode & 0o777 for f in files} == {0o600}, files
    assert RangeCache(0, str(own)).get("s3://b/k", v, 0, 8) == b"12345678"
    entry = next(f for f in files if not f.endswith("CACHEDIR.TAG"))
    os.chown(entry, other_user.uid, other_user.gid)
    assert RangeCache(0, str(own)).get("s3://b/k", v, 0, 8) is None
    assert not os.path.exists(entry)


# --------------------------------------------------------------------------- the right daemon

SYSTEM_PYTHON = "/usr/bin/python3"  # one the other user may run
IMPOSTOR = "import sys, time; time.sleep(120)"
FORGER = """
import json, os, socket, sys, time
path, doc = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.bind(path)
os.chmod(path, 0o777)
s.listen(4)
while True:
    c, _ = s.accept()
    try:
        c.sendall(doc.encode() + b"\\n")
    except OSError:
        pass
    c.close()
"""


@pytest.fixture
def other_processes():
    """Start processes (``start(user, argv)``) ended by PID at the end of the test."""
    procs: list[subprocess.Popen] = []

    def start(user: User, *argv: str) -> subprocess.Popen:
        cmd = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--", *argv]
        procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))
        return procs[-1]

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def test_umount_never_signals_an_impostor(tmp_path, other_user, other_processes, mount):
    """Finding 7: another user's process started as ``shardfs mount SRC MNT -f`` (before the real
    daemon, so first in /proc) gets no signal; the real daemon folds and unmounts."""
    src = tmp_path / "src"
    exp = build(src, [S])["s"]
    base = tmp_path / "m"
    base.mkdir()
    mnt = base / "mnt"
    mnt.mkdir()
    impostor = other_processes(other_user, SYSTEM_PYTHON, "-c", IMPOSTOR, "shardfs", "mount", str(src), str(mnt), "-f")
    from conftest import Mount

    real = Mount(src, mnt, base / "daemon.log", (), False)
    mount._mounts.append(real)
    real.wait_live()
    value = S.values(S.chunk, 4)
    (mnt / "s" / "0.0").write_bytes(S.encode(value))
    r = run_shardfs("umount", str(mnt), "--timeout", "20")
    assert (r.returncode, r.stderr) == (0, "")
    assert real.proc.wait(timeout=10) == 0
    assert impostor.poll() is None, "the impostor was signalled"
    exp[S.chunk_region((0, 0))] = value
    assert_source_equals(src, "s", exp)


ENDING_LISTENER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
if os.fork() == 0:  # the child keeps the listening socket; the listener itself ends
    os.setsid()
    print(os.getpid(), flush=True)
    while True:
        c, _ = s.accept()
        c.sendall(b"{}")
        c.close()
"""


def test_a_daemon_is_signalled_through_the_kernels_reference_never_its_pid_number(tmp_path):
    """Finding 7: the process that listened on a status socket ended (a child keeps the socket)
    and its pid number went to another process (``ns_last_pid``): ``pidfd_of``, which umount and
    the handover signal through, refuses (ProcessLookupError) instead of naming the newcomer."""
    import signal
    import sys

    from shardfs.app.mounts import Daemon, pidfd_of

    where = Path(tempfile.mkdtemp(prefix="shardfs-peer-"))
    path = str(where / "s.sock")
    listener = subprocess.Popen([sys.executable, "-c", ENDING_LISTENER, path], stdout=subprocess.PIPE, text=True)
    child = int(listener.stdout.readline())
    impostor = None
    try:
        assert listener.wait(timeout=10) == 0
        for _ in range(50):
            try:
                Path("/proc/sys/kernel/ns_last_pid").write_text(str(listener.pid - 1))
            except OSError as e:
                pytest.skip(f"cannot set ns_last_pid: {e}")
            impostor = subprocess.Popen(["sleep", "60"])
            if impostor.pid == listener.pid:
                break
            impostor.kill()
            impostor.wait()
            impostor = None
        if impostor is None:
            pytest.skip("the listener's pid number was not handed out again")
        with pytest.raises(ProcessLookupError):
            os.close(pidfd_of(Daemon(listener.pid, path, {})))
        assert impostor.poll() is None
    finally:
        if impostor is not None:
            impostor.kill()
            impostor.wait()
        os.kill(child, signal.SIGKILL)
        listener.stdout.close()
        shutil.rmtree(where, ignore_errors=True)


def test_a_takeover_file_is_read_only_if_it_is_the_users_own(shared, other_user, monkeypatch):
    """The supervisor runs the command line a handover leaves in the state directory
    (``takeover-PID.json``): it reads one only from a state directory of the user's own, as a
    regular file of theirs reached without a symlink; another user's file (or a symlink to
    one) there is refused with one line. (A state directory another user made refuses the
    mount itself, read-only too: the supervisor's worker keeps its ledger there.)"""
    from shardfs.app.supervisor import _own_file
    from shardfs.base.private import Refused

    home = shared / "st"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    sdir = Path(state.state_dir("/some/source"))
    state.private_dir(str(sdir))
    theirs = shared / "theirs.json"
    other_user.write(theirs, b'{"argv": ["/bin/sh", "-c", "touch /tmp/pwned"]}')
    planted = sdir / "takeover-1.json"
    shutil.copy(theirs, planted)
    os.chown(planted, other_user.uid, other_user.gid)
    with pytest.raises(Refused) as e:
        _own_file(str(planted))
    assert str(e.value) == refused(planted, foreign(other_user))
    planted.unlink()
    planted.symlink_to(theirs)
    with pytest.raises(Refused) as e:
        _own_file(str(planted))
    assert str(e.value) == refused(planted, "a symlink")
    planted.unlink()
    planted.write_text('{"argv": ["shardfs"]}')
    with open(_own_file(str(planted))) as f:
        assert f.read() == '{"argv": ["shardfs"]}'


def test_status_never_shows_a_forged_document(tmp_path, shared, other_user, other_processes, mount):
    """Finding 2: a status socket another user serves in a state directory they made, named for
    the real daemon's pid: ``shardfs status`` never shows its document."""
    src = tmp_path / "src"
    build(src, [S])
    mnt = mount(src, "--read-only")
    pid = mount.info(mnt).pid
    home = shared / "st"
    sdir = home / "shardfs" / state.source_id(str(src))
    other_user.sh(f"mkdir -p '{sdir}' && chmod -R 755 '{home}'")
    forged = {"mountpoint": str(mnt), "source": "FORGED", "pid": pid}
    import json

    other_processes(other_user, SYSTEM_PYTHON, "-c", FORGER, str(sdir / f"status-{pid}.sock"), json.dumps(forged))
    wait_for(lambda: (sdir / f"status-{pid}.sock").exists(), 10, "the forged socket")
    env = {**os.environ, "XDG_STATE_HOME": str(home)}
    r = run_shardfs("status", str(mnt), "--json", env=env)
    assert "FORGED" not in r.stdout
    assert (r.returncode, r.stderr) == (1, f"shardfs: error: {mnt}: no shardfs daemon of this user answers for it "
                                           "(another user's mount, a dead one, or one that could not make its "
                                           "status socket: its log says why)\n")
    r = run_shardfs("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    # no live mount of this user: only mounts no daemon serves (other tests' dead or stuck ones) are listed
    assert [d for d in json.loads(r.stdout) if not (d.get("dead") or d.get("stuck"))] == []


LISTENER = """
import socket, sys
s = socket.socket(fileno=int(sys.argv[2]))
s.listen(4)
while True:
    c, _ = s.accept()
    try:
        c.sendall(sys.argv[1].encode() + b"\\n")
    except OSError:
        pass
    c.close()
"""


def test_status_never_believes_a_socket_another_users_process_listens_on(tmp_path, other_user, mount):
    """A socket in the user's own state directory on which another user's process listens (the
    kernel's ``SO_PEERCRED`` names it) is never believed, whatever document it sends."""
    import json
    import socket

    src = tmp_path / "src"
    build(src, [S])
    mnt = mount(src, "--read-only")
    path = Path(state.state_dir(str(src))) / "status-0.sock"  # listed before the real one
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    os.chmod(path, 0o777)
    forged = json.dumps({"mountpoint": str(mnt), "source": "FORGED", "pid": 1})
    cmd = ["setpriv", f"--reuid={other_user.uid}", f"--regid={other_user.gid}", "--clear-groups", "--",
           SYSTEM_PYTHON, "-c", LISTENER, forged, str(sock.fileno())]
    proc = subprocess.Popen(cmd, pass_fds=(sock.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        sock.close()
        wait_for(lambda: _listening(path), 10, "the other user's listener")
        r = run_shardfs("status", str(mnt), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["source"] == str(src) and "FORGED" not in r.stdout
    finally:
        proc.kill()
        proc.wait(timeout=10)
        path.unlink()


def _listening(path: Path) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


# --------------------------------------------------------------------------- output

EVIL = "evil\x1b]0;pwned\x07\nFORGED 2026 shardfs[1] ERROR x"
EVIL_SHOWN = "evil\\x1b]0;pwned\\x07\\nFORGED 2026 shardfs[1] ERROR x"


def no_control(text: str) -> bool:
    return not any(ord(c) < 32 and c != "\n" or 0x7f <= ord(c) <= 0x9f for c in text)


def test_names_from_the_source_never_forge_log_lines(tmp_path, mount):
    """Finding 6: a group named with an escape sequence and a newline, whose ``zarr.json`` is bad:
    its warning is one log line, the name escaped."""
    src = tmp_path / "src"
    build(src, [S])
    (src / EVIL).mkdir()
    (src / EVIL / "zarr.json").write_text("{not json")
    mnt = mount(src, "--read-only")
    assert os.listdir(mnt / EVIL) == [], "a bad zarr.json hides its node"
    log = mount.info(mnt).log_text()
    assert EVIL_SHOWN in log, log[-3000:]
    assert no_control(log) and not any(line.startswith("FORGED") for line in log.splitlines())


def test_a_traceback_in_the_log_escapes_the_exceptions_text():
    """Finding 6: an internal error logged with its traceback (``log.exception``) whose
    exception names something from the source: the frames keep their lines, the exception's
    text is one escaped line."""
    import logging

    from shardfs.app.run import _Printable

    try:
        try:
            raise KeyError("x")
        except KeyError as e:
            raise ValueError(f"cannot read {EVIL}") from e
    except ValueError:
        import sys

        record = logging.LogRecord("shardfs", logging.ERROR, __file__, 1, "internal error", (), sys.exc_info())
    text = _Printable("%(levelname)s %(message)s").format(record)
    lines = text.splitlines()
    assert lines[0] == "ERROR internal error" and lines[1] == "Traceback (most recent call last):", text
    assert lines[-1] == f"ValueError: cannot read {EVIL_SHOWN}", text
    assert "KeyError: 'x'" in lines and no_control(text), text
    assert not any(line.startswith("FORGED") for line in lines), text


def test_inspect_status_and_errors_escape_what_they_print(tmp_path, mount):
    """Finding 6: ``inspect`` of an array whose ``data_type`` holds escapes, ``status`` of a source
    whose name does, and an error line naming such a path print them escaped."""
    src = tmp_path / EVIL
    build(src, [S])
    meta = src / "s" / "zarr.json"
    import json

    doc = json.loads(meta.read_text())
    doc["data_type"] = "int32\x1b[2J\nFORGED"
    meta.write_text(json.dumps(doc))
    r = run_shardfs("inspect", str(src / "s"))
    assert r.returncode == 0 and no_control(r.stdout + r.stderr), r.stdout
    assert "int32\\x1b[2J\\nFORGED" in r.stdout and "\nFORGED" not in r.stdout
    mnt = mount(src, "--read-only")
    r = run_shardfs("status", str(mnt))
    assert r.returncode == 0 and no_control(r.stdout), r.stdout
    assert r.stdout.splitlines()[0] == f"{mnt}  <-  {tmp_path}/{EVIL_SHOWN}"
    r = run_shardfs("inspect", str(tmp_path / EVIL / "missing"))
    assert r.returncode == 1 and no_control(r.stderr) and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"shardfs: error: {tmp_path}/evil\\x1b]0;pwned\\x07"), r.stderr


# --------------------------------------------------------------------------- allow_other

S2 = Spec("s", (8, 10), (4, 5), (4, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
          index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 10)),),
          write=(slice(0, 4), slice(0, 5)))


def mount_shared(mount, src: Path, base: Path, *extra: str) -> Path:
    """A mount of ``src`` on ``base/mnt`` (a place other users can reach), torn down by ``mount``."""
    from conftest import Mount

    base.mkdir(mode=0o755)
    (base / "mnt").mkdir()
    m = Mount(src, base / "mnt", base / "daemon.log", extra, False)
    mount._mounts.append(m)
    m.wait_live()
    return base / "mnt"


def test_allow_other_never_reads_a_shard_for_a_user_the_source_refuses(shared, other_user, mount):
    """Finding 4: under ``-o allow_other`` a chunk file of a 0600 shard is EACCES for another user
    (and so is every write of theirs), even where the modes shown would let the kernel allow it
    (``file_mode=0666``); a chunk of a 0644 shard reads the same bytes as for root."""
    src = shared / "src"
    build(src, [S2])
    S2.shard_file(src, (0, 0)).chmod(0o600)
    mnt = mount_shared(mount, src, shared / "m", "-o", "allow_other,file_mode=0666,dir_mode=0777")
    assert mnt.joinpath("s", "0.0").read_bytes()  # the mounting user reads it
    r = other_user.run("cat", str(mnt / "s" / "0.0"), check=False)
    assert (r.returncode, r.stdout) == (1, "") and "Permission denied" in r.stderr, r
    r = other_user.run("/bin/sh", "-c", f"od -An -tx1 '{mnt}/s/1.0' | tr -d ' \\n'", check=False)
    assert r.stdout == (mnt / "s" / "1.0").read_bytes().hex(), r
    r = other_user.sh(f"printf x > '{mnt}/s/1.0'", check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r


def test_follow_symlinks_never_reads_for_a_user_what_they_could_not(shared, other_user, mount):
    """Finding 4: with ``follow_symlinks``, a user's symlink in a source they can write, to a file
    only root may read, is EACCES for them through root's mount."""
    src = shared / "src"
    build(src, [S2])
    secret = shared / "secret-shard"
    shutil.copy(S2.shard_file(src, (1, 0)), secret)
    secret.chmod(0o600)
    S2.shard_file(src, (1, 0)).unlink()
    S2.shard_file(src, (0, 0)).parent.parent.chmod(0o777)
    S2.shard_file(src, (1, 0)).parent.chmod(0o777)
    other_user.sh(f"ln -s '{secret}' '{S2.shard_file(src, (1, 0))}'")
    mnt = mount_shared(mount, src, shared / "m", "-o", "allow_other,follow_symlinks", "--read-only")
    assert (mnt / "s" / "1.0").read_bytes()  # root may read it
    r = other_user.run("cat", str(mnt / "s" / "1.0"), check=False)
    assert (r.returncode, r.stdout) == (1, "") and "Permission denied" in r.stderr, r


def test_under_allow_other_the_kernel_checks_the_modes_shown(shared, other_user, mount):
    """The mount runs with ``default_permissions``: ``-o file_mode=0600`` (an object store's way
    to say who may read) keeps another user out of files the source would let them read."""
    src = shared / "src"
    build(src, [S2])
    mnt = mount_shared(mount, src, shared / "m", "-o", "allow_other,file_mode=0600", "--read-only")
    assert (mnt / "s" / "1.0").read_bytes()
    r = other_user.run("cat", str(mnt / "s" / "1.0"), check=False)
    assert (r.returncode, r.stdout) == (1, "") and "Permission denied" in r.stderr, r
    assert other_user.run("ls", str(mnt / "s")).returncode == 0


def test_uid_gid_and_modes_are_what_nodes_show(tmp_path, other_user, mount):
    """``-o uid=,gid=,file_mode=,dir_mode=`` (mountpoint-s3's names): every node shows them."""
    src = tmp_path / "src"
    build(src, [S2])
    mnt = mount(src, "-o", f"uid={other_user.uid},gid={other_user.gid},file_mode=0640,dir_mode=0750")
    for path, mode in ((mnt, 0o40750), (mnt / "s", 0o40750), (mnt / "s" / "0.0", 0o100640),
                       (mnt / "s" / ".zarray", 0o100640)):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid, st.st_mode) == (other_user.uid, other_user.gid, mode), path
    r = run_shardfs("mount", str(src), str(tmp_path / "m2"), "-o", "file_mode=999")
    assert (r.returncode, r.stderr) == (1, "shardfs: error: -o file_mode=999: not octal permission bits (e.g. 0640)\n")


# --------------------------------------------------------------------------- bounds


def peak_rss(pid: int) -> int:
    """The peak resident memory of ``pid`` so far (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def transcoded(src: Path, compressor: str = "zstd") -> None:
    """An unsharded array ``a`` whose chain v2 cannot express (served transcoded), 32 KiB chunks."""
    from sources import LE, gzip, transpose, write_v3, zstd

    write_v3(src / "a", np.arange(4 * 64 * 64, dtype="<i4").reshape(4, 64, 64), (2, 64, 64),
             [transpose((1, 0, 2)), LE, zstd(3) if compressor.startswith("zstd") else gzip(1)])
    (src / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')


BOMB = 256 << 20  # bytes of zeros in the bomb: its stored form is a few KiB
GZIP_BOMB = 40 << 20


def bomb(kind: str) -> bytes:
    """A frame of ``kind`` decoding to ``BOMB`` zero bytes: zstd saying its size in its header,
    zstd from a stream (no size said: ``zstd`` reading a pipe); gzip: ``GZIP_BOMB``."""
    import zlib

    import numcodecs

    if kind == "zstd":
        return numcodecs.Zstd(level=1).encode(bytes(BOMB))
    if kind == "gzip":  # deflate shrinks at most ~1032:1, and a stored chunk is at most ~41 KB here
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        return c.compress(bytes(GZIP_BOMB)) + c.flush()
    if not shutil.which("zstd"):
        pytest.skip("no zstd command (a frame without a content size)")
    r = subprocess.run(["sh", "-c", f"head -c {BOMB} /dev/zero | zstd -1 -c"], capture_output=True, check=True)
    assert r.stdout[4] >> 6 == 0 and not r.stdout[4] & 0x20, "no content size"
    return r.stdout


@pytest.mark.parametrize("kind", ["zstd", "zstd-streamed", "gzip"])
def test_a_decompression_bomb_is_corrupt_and_never_decoded(tmp_path, mount, kind):
    """Finding 5: an inner chunk of 32 KiB stored as a frame of a few KiB that decodes to 256 MiB
    (gzip: 40 KB to 40 MiB) is corrupt (EIO, one log line) before it is decoded: the daemon's
    peak RSS stays put."""
    src = tmp_path / "src"
    transcoded(src, kind)
    (src / "a" / "c" / "0" / "0" / "0").write_bytes(bomb(kind))
    mnt = mount(src, "--read-only")
    good = (mnt / "a" / "1.0.0").read_bytes()
    assert len(good) == 32768
    before = {pid: peak_rss(pid) for pid in serving_pids(mnt)}  # (whichever worker serves the read)
    with pytest.raises(OSError) as e:
        (mnt / "a" / "0.0.0").read_bytes()
    assert e.value.errno == 5
    assert all(peak_rss(pid) - rss < 32 << 20 for pid, rss in before.items()), before
    lines = [line for line in mount.info(mnt).log_text().splitlines() if "corrupt chunk" in line]
    why = f"says it decodes to {BOMB} bytes, not 32768" if kind == "zstd" else "decodes to more than 32768 bytes"
    assert len(lines) == 1 and lines[0].endswith(f"{src}/a/c/0/0/0: corrupt chunk 0.0.0: inner chunk {why}"), lines


@pytest.mark.parametrize("kind", ["zstd", "zstd-streamed", "gzip"])
def test_a_decompression_bomb_is_corrupt_in_process(tmp_path, caplog, kind):
    """The daemon's part of ``a_decompression_bomb_is_corrupt_and_never_decoded``, in-process
    (``tests/inproc.py``): the bomb's chunk file is EIO with one log line naming it, the chunk
    beside it reads whole."""
    from inproc import InProcess

    src = tmp_path / "src"
    transcoded(src, kind)
    (src / "a" / "c" / "0" / "0" / "0").write_bytes(bomb(kind))
    with InProcess(src) as fs:
        assert len((fs / "a" / "1.0.0").read_bytes()) == 32768
        with pytest.raises(OSError) as e:
            (fs / "a" / "0.0.0").read_bytes()
    assert e.value.errno == errno.EIO
    lines = [r.getMessage() for r in caplog.records if "corrupt chunk" in r.getMessage()]
    why = f"says it decodes to {BOMB} bytes, not 32768" if kind == "zstd" else "decodes to more than 32768 bytes"
    assert len(lines) == 1 and lines[0].endswith(f"{src}/a/c/0/0/0: corrupt chunk 0.0.0: inner chunk {why}"), lines


BIG = 1 << 30  # bytes of the sparse shard of ``long_stored_chunk``


def long_stored_chunk(src: Path) -> Path:
    """A source at ``src`` with array ``s``, whose shard (0, 0), a sparse file of ``BIG`` bytes,
    has an index giving one inner chunk (with a crc32c, so serving it reads it whole) all of it:
    that shard's path."""
    import crc32c

    spec = Spec("s", (8, 10), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=True,
                index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 10)),),
                write=(slice(0, 4), slice(0, 5)))
    build(src, [spec])
    shard = spec.shard_file(src, (0, 0))
    index = np.full((4, 2), 2**64 - 1, dtype="<u8")
    index[0] = (0, BIG - 68)
    raw = index.tobytes()
    with open(shard, "wb") as f:
        f.truncate(BIG - 68)
        f.seek(BIG - 68)
        f.write(raw + crc32c.crc32c(raw).to_bytes(4, "little"))
    return shard


def test_a_stored_chunk_longer_than_a_chunk_can_be_is_never_read(tmp_path, mount):
    """Finding 5: a sparse shard of 1 GiB whose index gives one inner chunk (with a crc32c, so
    serving it reads it whole) all of it: corrupt before it is read (EIO, one log line), the
    daemon's peak RSS stays put."""
    src = tmp_path / "src"
    shard, big = long_stored_chunk(src), BIG
    mnt = mount(src, "--read-only")
    assert os.stat(mnt / "s" / "0.0").st_size == big - 72
    before = {pid: peak_rss(pid) for pid in serving_pids(mnt)}  # (whichever worker serves the read)
    with pytest.raises(OSError) as e:
        (mnt / "s" / "0.0").read_bytes()
    assert e.value.errno == 5
    assert all(peak_rss(pid) - rss < 32 << 20 for pid, rss in before.items()), before
    lines = [line for line in mount.info(mnt).log_text().splitlines() if "corrupt chunk" in line]
    assert len(lines) == 1 and lines[0].endswith(
        f"{shard}: corrupt chunk 0.0: inner chunk of {big - 68} bytes stored, more than one inner chunk "
        f"takes ({80 + 10 + 1 + 4096 + 4}): not read"), lines


def test_a_stored_chunk_longer_than_a_chunk_can_be_is_corrupt_in_process(tmp_path, caplog):
    """The daemon's part of ``a_stored_chunk_longer_than_a_chunk_can_be_is_never_read``,
    in-process (``tests/inproc.py``): its size shown, then EIO and one log line naming it."""
    from inproc import InProcess

    src = tmp_path / "src"
    shard = long_stored_chunk(src)
    with InProcess(src) as fs:
        assert (fs / "s" / "0.0").stat().st_size == BIG - 72
        with pytest.raises(OSError) as e:
            (fs / "s" / "0.0").read_bytes()
    assert e.value.errno == errno.EIO
    lines = [r.getMessage() for r in caplog.records if "corrupt chunk" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith(
        f"{shard}: corrupt chunk 0.0: inner chunk of {BIG - 68} bytes stored, more than one inner chunk "
        f"takes ({80 + 10 + 1 + 4096 + 4}): not read"), lines


def test_max_chunk_bounds_what_is_decoded(tmp_path, mount):
    """``-o max_chunk``: inner chunks larger than it are never decoded (EIO, one log line per array)."""
    src = tmp_path / "src"
    transcoded(src)
    mnt = mount(src, "--read-only", "-o", "max_chunk=16K")
    for name in ("0.0.0", "1.0.0"):
        with pytest.raises(OSError) as e:
            (mnt / "a" / name).read_bytes()
        assert e.value.errno == 5
    lines = [line for line in mount.info(mnt).log_text().splitlines() if "not decoded" in line]
    assert len(lines) == 1 and lines[0].endswith(
        f"{src}/a: inner chunks of 32768 bytes are larger than -o max_chunk=16384: not decoded (EIO)"), lines


def test_decodes_in_all_threads_together_hold_at_most_the_budget():
    """Point 5: transcodes hold at most ``-o max_chunk`` chunk bytes at once, whatever the
    number of threads (``Budget``); one larger than the budget runs alone."""
    import threading
    import time

    from shardfs.base.budget import Budget

    budget, lock, held, peak = Budget(100), threading.Lock(), [0], [0]

    def decode(n: int) -> None:
        with budget.hold(n):
            with lock:
                held[0] += min(n, 100)
                peak[0] = max(peak[0], held[0])
            time.sleep(0.02)
            with lock:
                held[0] -= min(n, 100)

    threads = [threading.Thread(target=decode, args=(n,)) for n in [30, 40, 50, 60, 250, 30, 70] * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert peak[0] <= 100 and budget.held == 0, peak


@pytest.mark.parametrize("encoding", ["default", "v2"])
def test_a_huge_web_grid_lists_without_making_every_name(tmp_path, web_server, mount, encoding):
    """Finding 5: a web source's array of shape 2^40 with chunks of 1: ``ls`` answers at once with
    no chunk file (a grid that large is not listed; chunk files are found by name) and the
    daemon's peak RSS stays under 200 MiB."""
    import json

    root = tmp_path / "www" / "data.zarr"
    (root / "big").mkdir(parents=True)
    (root / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    doc = {"zarr_format": 3, "node_type": "array", "shape": [2**40], "data_type": "uint8",
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}},
           "chunk_key_encoding": {"name": encoding}, "fill_value": 7,
           "codecs": [{"name": "bytes"}], "attributes": {}}
    (root / "big" / "zarr.json").write_text(json.dumps(doc))
    server = web_server(tmp_path / "www")
    mnt = mount(f"{server.url}/data.zarr")
    assert sorted(os.listdir(mnt / "big")) == [".zarray", ".zattrs"]
    assert all(peak_rss(pid) < 200 << 20 for pid in serving_pids(mnt))
