"""FUSE command-line conventions: ``mount -t fuse.shardfs``, fstab lines, ``-o`` handling, logs.

Measured on this machine (util-linux 2.38, fuse3 3.14): ``mount`` runs its helpers with
PATH ``/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`` and the caller's
other environment; ``mount.fuse3`` drops the fstab-only options and runs
``shardfs SRC MNT -o ro,dev,suid`` (``rw,dev,suid`` without ``ro``). ``scripts/install``
links ``/usr/local/bin/shardfs``; PYTHONPATH makes that command run this checkout's code.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import daemon_pids, lazy_unmount, read_zarr2, run_shardfs, serving_pid
from shardfs.app import options, state
from sources import Spec, build
from writers import write_zarr2

MOUNT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
S = Spec("s", (8, 10), (4, 5), (8, 10), "<i4", 0, ("zstd", 3), inner_crc=False,
         index_location="end", index_crc=True, initial=((slice(0, 8), slice(0, 10)),),
         write=(slice(0, 4), slice(0, 5)))
SYSLOG = os.path.exists("/dev/log")


CODE = Path(options.__file__).resolve().parent.parent  # where the tested shardfs is (scripts/mutants: a copy)


def env() -> dict[str, str]:
    """The environment for commands that start a daemon: the code under test first (the
    shardfs this process imports: this checkout's, or the copy scripts/mutants made)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(CODE) + (os.pathsep + path if path else "")}


def run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env(),
                          stdin=subprocess.DEVNULL)





@pytest.fixture
def src(tmp_path) -> Path:
    build(tmp_path / "src", [S])
    return tmp_path / "src"


def mount_options(mnt: Path) -> list[str]:
    """The options /proc/mounts shows for ``mnt`` (a fuse.shardfs mount)."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == str(mnt):
            assert fields[2] == "fuse.shardfs", line
            return fields[3].split(",")
    raise AssertionError(f"{mnt} not in /proc/mounts")


def wait_daemon_gone(mnt: Path) -> None:
    deadline = time.monotonic() + 10
    while daemon_pids(mnt) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon_pids(mnt) == [], "daemon still running 10 s after the unmount"


def expected(src: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(str(src / "s"), mode="r")[...])


def check_read_only_and_readable(src: Path, mnt: Path) -> None:
    """Mounted read-only; zarr 2.18 reads the array and one chunk file exactly."""
    assert mount_options(mnt)[0] == "ro"
    exp = expected(src)
    np.testing.assert_array_equal(read_zarr2(mnt / "s"), exp)
    assert S.decode((mnt / "s" / "1.1").read_bytes()).tolist() == exp[4:8, 5:10].tolist()


def require_mount_helper() -> None:
    if os.geteuid() != 0:
        pytest.skip("mount -t fuse.* of a path not in /etc/fstab needs root")
    found = shutil.which("shardfs", path=MOUNT_PATH)
    assert found, f"no shardfs on mount's PATH {MOUNT_PATH}: run scripts/install"


# --------------------------------------------------------------------------- the mount.fuse3 form


def test_bare_form_as_mount_fuse3_runs_it_daemonizes_and_mounts(src, mnt_dir):
    r = run_shardfs(str(src), str(mnt_dir), "-o", "ro,dev,suid", env=env())
    assert r.returncode == 0, r.stderr
    assert os.path.ismount(mnt_dir), "not live when the command returned"
    assert daemon_pids(mnt_dir), "no daemon left running"
    opts = mount_options(mnt_dir)
    assert opts[0] == "ro" and "nodev" not in opts and "nosuid" not in opts, opts
    check_read_only_and_readable(src, mnt_dir)
    r = run_shardfs("umount", str(mnt_dir), env=env())
    assert r.returncode == 0, r.stderr
    wait_daemon_gone(mnt_dir)


def test_mount_t_fuse_shardfs_ro_netdev_nofail(src, mnt_dir):
    require_mount_helper()
    r = run("mount", "-t", "fuse.shardfs", str(src), str(mnt_dir), "-o", "ro,_netdev,nofail")
    assert r.returncode == 0, r.stderr
    check_read_only_and_readable(src, mnt_dir)
    r = run("umount", str(mnt_dir))
    assert r.returncode == 0, r.stderr
    assert not os.path.ismount(mnt_dir)
    wait_daemon_gone(mnt_dir)


def test_fstab_line_mounts_with_mount_mnt(src, mnt_dir, tmp_path):
    """The README's fstab line, used through ``mount -T FILE MNT`` (never the real /etc/fstab)."""
    require_mount_helper()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{src} {mnt_dir} fuse.shardfs ro,_netdev,nofail,noauto,x-systemd.automount 0 0\n")
    r = run("mount", "-T", str(fstab), str(mnt_dir))
    assert r.returncode == 0, r.stderr
    check_read_only_and_readable(src, mnt_dir)
    r = run("umount", str(mnt_dir))
    assert r.returncode == 0, r.stderr
    wait_daemon_gone(mnt_dir)


def test_fstab_only_options_are_ignored_and_writes_work(src, mnt_dir, tmp_path):
    """Everything fstab or mount.fuse3 may pass is accepted: the mount is rw and writable, and
    the ignored options are logged (--debug) by name."""
    log = tmp_path / "daemon.log"
    junk = "defaults,_netdev,nofail,user,users,noauto,auto,x-systemd.requires=a.service,comment=hi,relatime"
    r = run_shardfs(str(src), str(mnt_dir), "-o", junk, "-o", "rw,dev,suid,exec,noatime",
                    "--debug", "--log-file", str(log), env=env())
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert mount_options(mnt_dir)[0] == "rw"
    block = S.values(S.chunk, 3)
    write_zarr2(mnt_dir / "s", (slice(0, 4), slice(0, 5)), block, tmp_path)
    assert run_shardfs("umount", str(mnt_dir), env=env()).returncode == 0
    wait_daemon_gone(mnt_dir)
    got = expected(src)
    np.testing.assert_array_equal(got[0:4, 0:5], block)
    assert f"ignored mount options: {junk}" in log.read_text()


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("opt,message", [
    ("ro,foo", "-o foo: unknown option (shardfs --help lists them)"),
    ("fsname=x", "-o fsname=x: unknown option (shardfs --help lists them)"),
    ("allow_other=1", "-o allow_other=1: allow_other takes no value"),
    ("entry_timeout", "-o entry_timeout: entry_timeout needs a value (entry_timeout=S)"),
    ("attr_timeout=-1", "-o attr_timeout=-1: not a number of seconds"),
])
def test_bad_option_is_named_and_nothing_mounts(src, mnt_dir, opt, message):
    for argv in ([str(src), str(mnt_dir)], ["mount", str(src), str(mnt_dir), "-f"]):
        r = run_shardfs(*argv, "-o", opt, env=env())
        assert (r.returncode, r.stderr) == (1, f"shardfs: error: {message}\n")
        assert not os.path.ismount(mnt_dir) and daemon_pids(mnt_dir) == []


def test_unknown_option_through_mount_t_is_named(src, mnt_dir):
    require_mount_helper()
    r = run("mount", "-t", "fuse.shardfs", str(src), str(mnt_dir), "-o", "ro,nofail,bogus_opt")
    assert r.returncode != 0
    assert "shardfs: error: -o bogus_opt: unknown option (shardfs --help lists them)" in r.stderr, r.stderr
    assert not os.path.ismount(mnt_dir) and daemon_pids(mnt_dir) == []


def test_libfuse_reason_is_shown(src, mnt_dir):
    """An option libfuse takes but the kernel refuses: libfuse's own words, not only pyfuse3's."""
    for argv in ([str(src), str(mnt_dir)], ["mount", str(src), str(mnt_dir), "-f"]):
        r = run_shardfs(*argv, "-o", "ro,max_read=-1", env=env())
        assert (r.returncode, r.stderr) == (1, f"shardfs: error: {mnt_dir}: cannot mount: fuse: mount failed: "
                                               "Invalid argument (fuse_session_mount failed)\n")
        assert not os.path.ismount(mnt_dir) and daemon_pids(mnt_dir) == []


def test_non_root_failure_reason_is_libfuses(tmp_path):
    """As an unprivileged user: /dev/fuse not open to others (as in many containers), or
    allow_other without user_allow_other in /etc/fuse.conf. The reason libfuse or fusermount3
    prints is the error shardfs shows."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    nobody = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="shardfs-nobody-"))  # tmp_path is root-only
    try:
        os.chmod(top, 0o755)
        build(top / "src", [S])
        mnt = top / "mnt"
        mnt.mkdir()
        os.chown(mnt, nobody.pw_uid, nobody.pw_gid)
        if os.stat("/dev/fuse").st_mode & 0o006 != 0o006:
            want = "fuse: failed to open /dev/fuse: Permission denied (fuse_session_mount failed)"
        else:
            conf = Path("/etc/fuse.conf").read_text() if os.path.exists("/etc/fuse.conf") else ""
            if any(line.strip() == "user_allow_other" for line in conf.splitlines()):
                pytest.skip("this machine lets users mount with allow_other")
            want = ("fusermount3: option allow_other only allowed if 'user_allow_other' is set in "
                    "/etc/fuse.conf (fuse_session_mount failed)")
        # The daemon's python lives where nobody may not exec it again: run in the foreground.
        r = subprocess.run(
            ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
             sys.executable, "-m", "shardfs", "mount", str(top / "src"), str(mnt),
             "-f", "-o", "ro,allow_other"],
            capture_output=True, text=True, timeout=60, cwd=top,
            env={**env(), "XDG_STATE_HOME": str(top / "state"), "HOME": str(top)})
        assert (r.returncode, r.stderr) == (1, f"shardfs: error: {mnt}: cannot mount: {want}\n")
        assert not os.path.ismount(mnt)
    finally:
        lazy_unmount(top / "mnt")
        shutil.rmtree(top, ignore_errors=True)


def test_mount_from_a_directory_holding_python_modules(src, mnt_dir, tmp_path):
    """The daemon imports its own modules, not files of the directory ``shardfs mount`` runs in."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name in ("trio", "attr", "numpy", "zarr"):
        (cwd / f"{name}.py").write_text("raise ImportError('the wrong module')\n")
    r = run_shardfs("mount", str(src), str(mnt_dir), "-o", "ro", env=env(), cwd=cwd)
    try:
        assert r.returncode == 0, r.stderr
        assert os.path.ismount(mnt_dir)
        assert sorted(os.listdir(mnt_dir)) == [".zattrs", ".zgroup", ".zmetadata", S.name]
    finally:
        lazy_unmount(mnt_dir)


def test_mount_returns_with_zarr_imported_before_any_request(src, mnt_dir):
    """``shardfs mount`` returns once the daemon has imported zarr-python and numcodecs (0.15-0.3 s,
    which the first lookup of any node needs): a client reading right after the mount never
    waits for that import. Checked before the mount is asked anything: numcodecs' extension
    modules are already mapped into the daemon."""
    r = run_shardfs("mount", str(src), str(mnt_dir), "-o", "workers=1", env=env())  # (the one worker's maps)
    assert r.returncode == 0, r.stderr
    pid = serving_pid(mnt_dir)
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    extensions = {Path(line.split()[-1]).parent.name for line in maps if line.endswith(".so")}
    assert "numcodecs" in extensions, sorted(extensions)
    assert run_shardfs("umount", str(mnt_dir), env=env()).returncode == 0
    wait_daemon_gone(mnt_dir)


def test_every_module_of_the_package_is_byte_compiled_and_current():
    """``scripts/install`` (and ``scripts/test``, for the files changed since) byte-compile the
    package: the three interpreters of a mount load its modules compiled, even where
    PYTHONDONTWRITEBYTECODE keeps Python from writing them itself (doc/INSTALL.md). Each
    module's ``.pyc`` exists and records its source as it is now (size and mtime, or hash)."""
    package = Path(__file__).resolve().parent.parent / "shardfs"  # (the checkout's, not a mutant's copy)
    stale = []
    for source in sorted(package.rglob("*.py")):
        try:
            header = Path(importlib.util.cache_from_source(str(source))).read_bytes()[:16]
        except OSError:
            stale.append(f"{source}: none")
            continue
        flags = int.from_bytes(header[4:8], "little")
        data = source.read_bytes()
        st = source.stat()
        current = header[8:16] == importlib.util.source_hash(data) if flags & 1 else (
            int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF)
        if header[:4] != importlib.util.MAGIC_NUMBER or not current:
            stale.append(f"{source}: stale")
    assert stale == []
    assert len(list(package.rglob("*.py"))) > 100


# --------------------------------------------------------------------------- logs and help


@pytest.mark.parametrize("debug", [False, True])
def test_background_daemon_log_location_is_printed_with_debug(src, mnt_dir, debug):
    """Where the log goes without syslog is said once, with ``--debug`` (not on every mount)."""
    r = run_shardfs("mount", str(src), str(mnt_dir), "-o", "ro", *["--debug"] * debug, env=env())
    assert r.returncode == 0, r.stderr
    logfile = Path(state.log_file(str(src)))
    if SYSLOG or not debug:
        assert r.stderr == ""
    else:
        assert r.stderr == f"shardfs: no syslog (/dev/log): the daemon logs to {logfile}\n"
    if not SYSLOG:
        assert logfile.parent == Path(os.environ["XDG_STATE_HOME"]) / "shardfs" / state.source_id(str(src))
        assert stat.S_IMODE(logfile.parent.stat().st_mode) == 0o700
    assert run_shardfs("umount", str(mnt_dir), env=env()).returncode == 0
    wait_daemon_gone(mnt_dir)
    if not SYSLOG and not debug:
        lines = logfile.read_text().splitlines()
        assert any(line.endswith(f"INFO mounted {src} on {mnt_dir} (read-only)") for line in lines), lines
        assert lines[-1].endswith(f"INFO unmounted {mnt_dir}"), lines


@pytest.mark.parametrize("argv", [["--help"], ["mount", "--help"]])
def test_help_lists_every_option(argv):
    r = run_shardfs(*argv)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    flags = [o.name for o in options.FUSE if o.value is None and o.help.startswith("kernel mount flags")]
    assert f"  {','.join(flags)}" in lines
    for o in options.OWN + options.FUSE:
        if o.name not in flags:
            name = f"{o.name}={o.value}" if o.value else o.name
            assert f"  {name:22} {o.described}" in lines, f"-o {name} not in --help"
    ignored = " ".join(lines[lines.index("ignored (fstab and mount(8) options that mean nothing to shardfs):"):])
    for name in sorted(options.IGNORED) + ["x-*", "comment=*"]:
        assert f" {name}," in ignored or ignored.endswith(f" {name}"), f"ignored option {name} not in --help"
    assert "shardfs SRC MNT [-o OPT,...]" in " ".join(r.stdout.split())
