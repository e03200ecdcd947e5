"""shardfs daemons the soak starts, signals and stops by PID (never by name).

``Daemon(name, src, mnt, options, env, log_dir)``: ``start()`` runs ``shardfs mount SRC MNT -f
--log-file LOG -o ...`` in its own session and returns once MNT is a mountpoint (``Wedged`` if
not within ``MOUNT_TIMEOUT``, ``RuntimeError`` if the daemon exited first); ``kill()`` is the
crash (SIGKILL of the supervisor, whose worker dies with it, then ``fusermount3 -u -z``);
``kill_worker()`` is the crash of the worker alone (SIGKILL of the supervisor's child; the
supervisor starts another on the same connection: no unmount, no remount);
``umount(timeout)`` is ``shardfs umount --timeout`` and returns (exit status, seconds, the
daemon's exit status); ``close()`` (for ``finally`` blocks) lazily unmounts and SIGKILLs the
daemon if it is still there. ``stats()`` reads the /proc entries of the daemon (supervisor
and worker): RSS, open fds apart from sockets, sockets, threads, bytes of its spill
files (unlinked files it holds open under ``spill/``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SHARDFS = str(Path(sys.executable).parent / "shardfs")
MOUNT_TIMEOUT = 60.0
KILL_TIMEOUT = 30.0


class Wedged(Exception):
    """Something did not finish within its timeout."""


def is_mounted(mnt: str | Path) -> bool:
    """``mnt`` is in the mount table (also a dead FUSE mount whose stat fails)."""
    target = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def abort_connection(mnt: str | Path) -> None:
    """Abort the FUSE connection of mount ``mnt`` (/sys/fs/fuse/connections/N/abort): every
    request in flight fails and a daemon blocked in the kernel on it is released."""
    target = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == target:
                minor = fields[2].split(":")[1]
                try:
                    Path(f"/sys/fs/fuse/connections/{minor}/abort").write_text("1")
                except OSError:
                    pass


def immutable(path: Path, on: bool) -> None:
    """``chattr +i`` / ``-i`` (best effort: some filesystems have no such flag)."""
    subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)


def lazy_unmount(mnt: str | Path) -> None:
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=60)


def pss_kib(pid: int) -> int:
    """The proportional set size of ``pid`` (KiB; 0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Daemon:
    """One mount of the soak (see the module docstring)."""

    def __init__(self, name: str, src: str, mnt: Path, options: list[str], env: dict[str, str], log_dir: Path):
        self.name, self.src, self.mnt, self.options, self.env = name, src, Path(mnt), options, env
        self.log = log_dir / f"daemon-{name}.log"
        self.out = log_dir / f"daemon-{name}.out"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.worker_kills = 0
        self.mnt.mkdir(parents=True, exist_ok=True)
        immutable(self.mnt, True)  # while unmounted (a restart), no client can write into the bare directory

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self) -> float:
        """Mount; the seconds it took to be live."""
        t0 = time.monotonic()
        cmd = [SHARDFS, "mount", self.src, str(self.mnt), "-f", "--log-file", str(self.log)]
        for opt in self.options:
            cmd += ["-o", opt]
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **self.env}, start_new_session=True)
        self.starts += 1
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon {self.name} exited with {self.proc.returncode} before the mount was live:\n"
                                   + self.tail())
            if time.monotonic() - t0 > MOUNT_TIMEOUT:
                raise Wedged(f"daemon {self.name}: not live {MOUNT_TIMEOUT:g} s after start")
            time.sleep(0.05)
        return time.monotonic() - t0

    def kill(self) -> None:
        """SIGKILL the daemon (a crash), reap it, and lazily unmount its dead mount. A daemon
        that SIGKILL cannot end within ``KILL_TIMEOUT`` (blocked in the kernel on its own mount)
        has its FUSE connection aborted, then ``Wedged`` is raised."""
        wedged = False
        if self.pid is not None:
            assert self.proc is not None
            os.kill(self.pid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=KILL_TIMEOUT)
            except subprocess.TimeoutExpired:
                wedged = True
                abort_connection(self.mnt)
                self.proc.wait(timeout=60)
        lazy_unmount(self.mnt)
        if wedged:
            raise Wedged(f"daemon {self.name}: SIGKILL did not end it within {KILL_TIMEOUT:g} s "
                         "(blocked in the kernel); its FUSE connection was aborted")

    def worker_pids(self) -> list[int]:
        """The pids of the supervisor's workers (``-o workers=N``: N of them once all serve)."""
        from shardfs.app.zygote import workers_of

        return [] if self.pid is None else workers_of(self.pid)

    def kill_worker(self) -> int:
        """SIGKILL the worker (a crash, an OOM kill) and wait until another one serves the mount
        (``shardfs status`` names it); its pid. ``Wedged`` if none does within ``MOUNT_TIMEOUT``,
        ``RuntimeError`` if the daemon has no worker (not supervised, or gone)."""
        before = self.worker_pids()
        if not before:
            raise RuntimeError(f"daemon {self.name}: no worker to kill (is the mount supervised?)")
        self.worker_kills += 1
        old = before[self.worker_kills % len(before)]  # (with N workers: each in turn, the owner too)
        os.kill(old, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < MOUNT_TIMEOUT:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"daemon {self.name}: the supervisor exited with {self.proc.returncode} "
                                   "after its worker was killed:\n" + self.tail())
            now = self.worker_pids()
            new = [p for p in now if p not in before]
            if len(now) == len(before) and new:
                doc = self.status()
                if len(before) > 1 or (doc.get("worker") or {}).get("pid") == new[0]:
                    return new[0]
            time.sleep(0.05)
        raise Wedged(f"daemon {self.name}: no new worker serves {MOUNT_TIMEOUT:g} s after its worker was killed")

    def umount(self, timeout: float) -> tuple[int, float, int | None]:
        """``shardfs umount MNT --timeout T``: (its status, seconds, the daemon's status or None if it
        was still running ``timeout`` + 30 s later)."""
        t0 = time.monotonic()
        try:
            r = subprocess.run([SHARDFS, "umount", str(self.mnt), "--timeout", str(timeout)], capture_output=True,
                               text=True, timeout=timeout + 30, env={**os.environ, **self.env})
            status = r.returncode
            if status:
                print(f"soak: shardfs umount {self.mnt}: status {status}: {r.stderr.strip()[-2000:]}", flush=True)
        except subprocess.TimeoutExpired:
            status = -1
        try:
            rc = self.proc.wait(timeout=30) if self.proc is not None else 0
        except subprocess.TimeoutExpired:
            rc = None
        return status, time.monotonic() - t0, rc

    def close(self) -> None:
        """For ``finally``: unmount, and end the daemon if it is still there (by PID; a daemon
        blocked in the kernel has its FUSE connection aborted first); the mountpoint becomes an
        ordinary directory again."""
        if self.proc is not None and self.proc.poll() is None and self._stuck():
            abort_connection(self.mnt)
        lazy_unmount(self.mnt)
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                try:
                    self.proc.wait(timeout=KILL_TIMEOUT)
                except subprocess.TimeoutExpired:
                    abort_connection(self.mnt)
                    self.proc.wait(timeout=60)
        if not is_mounted(self.mnt):
            immutable(self.mnt, False)

    def _stuck(self) -> bool:
        """The daemon's main thread is blocked writing to /dev/fuse (in the kernel)."""
        assert self.proc is not None
        try:
            return "fuse_dev" in Path(f"/proc/{self.proc.pid}/stack").read_text()
        except OSError:
            return False

    def tail(self, n: int = 4000) -> str:
        text = ""
        for p in (self.log, self.out):
            try:
                text += p.read_text(errors="replace")[-n:]
            except FileNotFoundError:
                pass
        return text

    def status(self) -> dict:
        """``shardfs status MNT --json`` of the daemon ({} if it does not answer within 10 s)."""
        import json

        try:
            r = subprocess.run([SHARDFS, "status", str(self.mnt), "--json"], capture_output=True, text=True,
                               timeout=10, env={**os.environ, **self.env})
            return json.loads(r.stdout) if r.returncode == 0 else {}
        except (subprocess.TimeoutExpired, ValueError):
            return {}

    def stats(self) -> dict[str, float]:
        """RSS (MiB), open fds (files, pipes, /dev/fuse), sockets (the object store client's
        connections, a pool), threads and spill bytes of the running daemon, its supervisor and
        worker together, and its pid ({} if it is not running)."""
        pid = self.pid
        if pid is None:
            return {}
        out = {"rss_mib": 0.0, "fds": 0, "sockets": 0, "threads": 0, "spill_bytes": 0,
               "worker_rss_mib": 0.0, "pss_mib": 0.0, "pid": pid}  # (the RSS ones: samples.jsonl only)
        for p in [pid, *self.worker_pids()]:
            try:
                status = Path(f"/proc/{p}/status").read_text()
                fds = os.listdir(f"/proc/{p}/fd")
            except OSError:
                if p == pid:
                    return {}
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if "VmRSS" not in fields:  # a zombie: a worker just killed, not reaped yet
                if p == pid:
                    return {}
                continue
            spill = sockets = 0
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{p}/fd/{fd}")
                    sockets += target.startswith("socket:")
                    if "/spill/" in target:
                        spill += os.stat(f"/proc/{p}/fd/{fd}").st_size
                except OSError:
                    pass
            out["rss_mib"] += int(fields["VmRSS"].split()[0]) / 1024
            if p != pid:
                out["worker_rss_mib"] += int(fields["VmRSS"].split()[0]) / 1024
            out[f"pss_{p}"] = pss_kib(p) / 1024  # (which process grew: samples.jsonl only)
            out["pss_mib"] += out[f"pss_{p}"]  # (a forked worker's RSS counts the pages it shares with the zygote)
            out["fds"] += len(fds) - sockets
            out["sockets"] += sockets
            out["threads"] += int(fields["Threads"])
            out["spill_bytes"] += spill
        return out
