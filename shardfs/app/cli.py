"""Command line: ``shardfs mount | umount | inspect | status`` (argparse) and each command.

``shardfs mount SRC MNT`` checks SRC and the ``-o`` options, then starts the daemon
(``shardfs.app.run``: this same program with ``-f`` in a new session) and returns once the
daemon reports, over a pipe, that the mount is live or why it failed (libfuse's own
words included). ``shardfs SRC MNT [-o ...]`` is the same: the form
``mount -t fuse.shardfs`` (through mount.fuse3) and fstab use.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

from shardfs import __version__
from shardfs.app import options, state
from shardfs.app.mounts import Daemon, daemon_of, dead_source, mounts, pidfd_of, running
from shardfs.app.run import run_daemon, spawn_daemon, take_over
from shardfs.app.usage import UsageError
from shardfs.format.printable import printable, printable_doc
from shardfs.storage.source import Source
from shardfs.storage.urls import is_url

log = logging.getLogger("shardfs")
COMMANDS = ("mount", "umount", "inspect", "status")
BARE_FORM = ("`shardfs SRC MNT [-o OPT,...]` is `shardfs mount SRC MNT ...` "
             "(the form mount -t fuse.shardfs and /etc/fstab use).")
UMOUNT_TIMEOUT = 60.0
PROGRESS_MIN = 100  # shard indexes to read before inspect shows a progress bar


def main(argv: list[str] | None = None) -> int:
    """The ``shardfs`` program: its exit status. Run as the program (``argv`` None), a process
    that used an object store ends here (``_exit``) instead of returning."""
    code = _main(sys.argv[1:] if argv is None else list(argv))
    if argv is None and "obstore" in sys.modules:
        _exit(code)
    return code


def _exit(code: int) -> None:
    """End the process now, output flushed, without interpreter finalization.

    obstore's tokio threads can still be finishing a request's bookkeeping when Python
    finalizes; a thread that then asks for the GIL is ended with ``pthread_exit``, whose
    unwinding cannot cross Rust frames, so the process aborts (status 134) after having
    done everything right (seen in about a third of runs)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] not in COMMANDS and not any(a.startswith("-") for a in argv[:2]):
        argv.insert(0, "mount")  # ``shardfs SRC MNT -o ...``, as mount.fuse3 runs it
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        print(_versions())
        return 0
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("shardfs: error: a command is required (mount, umount, inspect, status)", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except UsageError as e:
        print(f"shardfs: error: {printable(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardfs",
        description="Mount sharded Zarr v3 data as plain Zarr v2 arrays (FUSE). " + BARE_FORM,
        epilog=options.help_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="store_true", help="print versions and exit")
    sub = p.add_subparsers(dest="command")
    m = sub.add_parser("mount", help="mount SRC (a Zarr v3 group or array) on MNT", description=BARE_FORM,
                       epilog=options.help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("src", metavar="SRC")
    m.add_argument("mnt", metavar="MNT")
    m.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    m.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="mount options (listed below)")
    m.add_argument("--read-only", action="store_true", help="refuse every write (EROFS)")
    m.add_argument("--no-ome-translation", dest="ome", action="store_false",
                   help="show OME-Zarr 0.5 attributes as they are, not as OME-Zarr 0.4")
    m.add_argument("--debug", action="store_true", help="log every request")
    m.add_argument("--log-file", metavar="FILE",
                   help="log here (default: stderr with -f, else syslog, else a file in the state directory)")
    m.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    m.add_argument("--go-fd", type=int, default=None, help=argparse.SUPPRESS)  # run.spawn_daemon's check
    m.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # shardfs.app.supervisor
    m.add_argument("--zygote", type=int, default=None, help=argparse.SUPPRESS)  # shardfs.app.zygote
    m.add_argument("--resolved", default=None, help=argparse.SUPPRESS)  # Source.resolved: found by shardfs mount
    m.set_defaults(run=_cmd_mount)
    i = sub.add_parser("inspect", help="show the codecs, shapes and index of an array or shard")
    i.add_argument("path", metavar="PATH", help="a shard file, a shard directory in a mount, or an array")
    i.add_argument("--json", action="store_true", help="print JSON for scripts")
    i.add_argument("--slice", metavar="I,J,...",
                   help="the 2-D slice of the shard grid the map shows: ':' for the two dimensions shown, an "
                        "array index for each other one (default: the last two dimensions, index 0 of the others)")
    i.add_argument("--map", metavar="FILE.png", help="also draw a heat map of the chunks stored per shard "
                                                     "(needs matplotlib: pip install 'shardfs[map]')")
    i.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="for an object-store URL: endpoint=, region=, anonymous, timeout= (as for mount)")
    i.set_defaults(run=_cmd_inspect)
    s = sub.add_parser("status", help="what a mount is doing: requests, store, caches, pending writes, folds")
    s.add_argument("mnt", metavar="MNT", nargs="?", help="a mountpoint (default: every shardfs mount of this user)")
    s.add_argument("--json", action="store_true", help="print JSON (an object with MNT, else a list of them)")
    s.add_argument("--watch", type=float, metavar="S", help="show it again every S seconds until interrupted")
    s.set_defaults(run=_cmd_status)
    u = sub.add_parser("umount", help="flush pending writes and unmount MNT")
    u.add_argument("mnt", metavar="MNT")
    u.add_argument("--timeout", type=float, default=UMOUNT_TIMEOUT, metavar="S",
                   help=f"seconds to wait for pending writes to reach their shards (default {UMOUNT_TIMEOUT:g}); "
                        "then the daemon is stopped and what is left stays in the write journal, "
                        "replayed by the next mount")
    u.set_defaults(run=_cmd_umount)
    return p


def _versions() -> str:
    import pyfuse3
    import zarr

    libfuse = subprocess.run(["pkg-config", "--modversion", "fuse3"], capture_output=True, text=True)
    return (f"shardfs {__version__}\npyfuse3 {pyfuse3.__version__}\nzarr {zarr.__version__}\n"
            f"libfuse {libfuse.stdout.strip() or 'unknown'}")


def check_source(src: str, source: Source) -> dict[str, Any]:
    """The root ``zarr.json`` of the source (``src`` as given); ``UsageError`` if it is not a
    readable Zarr v3 node (an object store: nor reachable with these credentials)."""
    if source.kind.remote:
        return _check_url(source)
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file or directory")
    if not os.path.isdir(src):
        raise UsageError(f"{src}: not a directory")
    from shardfs.tree.metadata import BadMetadata, read_file

    meta = os.path.join(src, "zarr.json")
    try:
        doc = read_file(meta)
    except BadMetadata as e:
        raise UsageError(f"{meta}: not Zarr v3 group or array metadata: {e}") from None
    except FileNotFoundError:
        v2 = any(os.path.exists(os.path.join(src, n)) for n in (".zarray", ".zgroup"))
        why = "Zarr v2 data, not Zarr v3" if v2 else "not a Zarr v3 group or array (no zarr.json)"
        raise UsageError(f"{src}: {why}") from None
    except PermissionError:
        raise UsageError(f"{meta}: permission denied") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{meta}: unreadable: {e}") from None
    return doc


def _check_url(source: Source) -> dict[str, Any]:
    """``check_source`` for an object store: the bucket and prefix answer (``ObjectStorage.check``:
    credentials, bucket, prefix, endpoint) and hold a Zarr v3 ``zarr.json``."""
    from shardfs.tree.metadata import BadMetadata, parse
    from shardfs.storage.requests import StorageUnavailable

    try:
        with source.opened() as storage:
            storage.check()
            try:
                data, _ = storage.read_all("zarr.json")
            except FileNotFoundError:
                v2 = any(storage.version(n) is not None for n in (".zarray", ".zgroup"))
                why = "Zarr v2 data, not Zarr v3" if v2 else "not a Zarr v3 group or array (no zarr.json)"
                raise UsageError(f"{source.name}: {why}") from None
    except StorageUnavailable as e:
        raise UsageError(str(e)) from None
    except ValueError as e:  # a URL obstore cannot use (or region= for another scheme)
        raise UsageError(str(e).splitlines()[0]) from None
    except OSError as e:
        raise UsageError(f"{source.name}/zarr.json: unreadable: {e.strerror or e}") from None
    try:
        return parse(data)
    except BadMetadata as e:
        raise UsageError(f"{source.name}/zarr.json: not Zarr v3 group or array metadata: {e}") from None


def _cmd_mount(args: argparse.Namespace) -> int:
    try:
        opts = options.parse(args.options)
        source = options.source(args.src, opts, resolved=args.resolved)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.worker is not None:  # a supervisor's worker: the supervisor checked it all
        return run_daemon(args, os.path.abspath(args.mnt), opts, source)
    if args.zygote is not None:  # forks the supervisor's workers (shardfs.app.zygote)
        from shardfs.app import zygote
        from shardfs.app.run import preload

        def worker(fd: int) -> int:
            args.worker, args.zygote = fd, None
            return run_daemon(args, os.path.abspath(args.mnt), opts, source)

        return zygote.serve(args.zygote, lambda: preload(source), worker)
    if args.go_fd is not None and not _went(args.go_fd):  # the check beside this daemon's start failed
        from shardfs.app import early

        early.discard()
        return 1
    # an object store is checked by the command that spawns the daemon, beside its start
    # (``run.spawn_daemon``), not by the daemon (``--ready-fd``)
    later = source.kind.remote and args.ready_fd is None and not args.foreground
    if not source.kind.remote:
        check_source(args.src, source)
    elif args.ready_fd is None and args.foreground:
        _check_apart(args.src, source)  # (this process goes on as the mount's supervisor)
    mnt = os.path.abspath(args.mnt)
    _detach_dead(args.mnt, mnt)
    try:
        os.makedirs(mnt, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{args.mnt}: cannot create mountpoint: {e.strerror}") from None
    if _mounted(mnt):
        if later:
            check_source(args.src, source)
        if take_over(args, mnt, opts, source):
            return 0  # handed to a new worker (a supervised mount of the same source)
        raise UsageError(f"{args.mnt}: already a mountpoint: unmount it first (shardfs umount {args.mnt})")
    _check_empty(args.mnt, mnt, options.config(opts).nonempty)
    if args.foreground:
        return run_daemon(args, mnt, opts, source)
    return spawn_daemon(args, source, (lambda: check_source(args.src, source)) if later else None)


def _went(fd: int) -> bool:
    """True if ``shardfs mount`` said "go" on pipe ``fd`` (its check of the store passed), False
    if it closed it without a word (the check failed: it says why)."""
    with os.fdopen(fd, "rb") as pipe:
        return pipe.read() == b"go"


def _check_apart(src: str, source: Source) -> None:
    """``check_source`` of a remote source in a child process, for a foreground mount: this
    process goes on as the mount's supervisor, which then holds none of the object store's client
    that the check imports (obstore, botocore: 37 MiB of memory against 18 for the mount's life).
    ``UsageError`` as ``check_source`` raises it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        why = ""
        try:
            check_source(src, source)
        except UsageError as e:
            why = str(e)
        except Exception as e:  # (a bug: said, as the command itself would have failed)
            why = f"{src}: the source could not be checked: {e!r}"
        os.write(write, why.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        why = answer.read().decode()
    _, status = os.waitpid(pid, 0)
    if why or status:
        raise UsageError(why or f"{src}: the check of the source ended without an answer")


def _mounted(mnt: str) -> bool:
    """Whether ``mnt`` (absolute) is a mountpoint: a shardfs mount in the kernel's table, or any
    other that ``os.path.ismount`` finds. Not ``ismount`` alone: it stats the mount's root, which
    fails while the root's metadata cannot be read (an object store down: ``umount`` then said
    "not mounted")."""
    return mnt in mounts() or os.path.ismount(mnt)


def _detach_dead(given: str, mnt: str) -> bool:
    """Detach ``mnt`` (``fusermount3 -u -z``) if it is a shardfs mount whose daemon is gone,
    saying so in one line on stderr; True if it was one. What its write journal holds is
    folded by the next mount of its source, as after any crash. ``UsageError`` (what it is
    and what to run) if it cannot be detached."""
    src = dead_source(mnt)
    if src is None:
        return False
    result = subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, text=True)
    if result.returncode:
        raise UsageError(f"{given}: a dead shardfs mount of {src} (its daemon is gone) that this user cannot "
                         f"detach: run shardfs umount {given} as the user who mounted it")
    print(f"shardfs: {printable(given)}: detached a dead shardfs mount of {printable(src)} (its daemon was gone); "
          "its pending writes, if any, are folded by the next mount of that source", file=sys.stderr)
    return True


def _check_empty(given: str, mnt: str, nonempty: bool) -> None:
    """``UsageError`` if ``mnt`` holds entries and ``-o nonempty`` was not given: the mount would
    hide them (libfuse 2's and s3fs's rule; libfuse 3 mounts over them without a word)."""
    try:
        with os.scandir(mnt) as entries:
            occupied = next(entries, None) is not None
    except OSError:
        return  # libfuse says why it cannot mount there
    if occupied and not nonempty:
        raise UsageError(f"{given}: mountpoint is not empty (the mount would hide its files): "
                         "empty it, or mount over it with -o nonempty")


def _cmd_inspect(args: argparse.Namespace) -> int:
    """Print what ``shardfs.app.report.inspect`` finds; draw ``--map`` (of a shard's array, for a
    shard) and say on stderr what it wrote. Reading many shard indexes shows a progress bar on a
    terminal's stderr."""
    from shardfs.format.gridmap import SIZE, parse_slice, png
    from shardfs.app.report import format_text, inspect

    bars: list[Any] = []

    def progress(total: int) -> Any:
        if total < PROGRESS_MIN or not sys.stderr.isatty():
            return None
        from tqdm import tqdm

        bars.append(tqdm(total=total, unit="shard", desc="reading shard indexes", file=sys.stderr, leave=False))
        return bars[-1].update

    try:
        report = inspect(args.path, options.parse(args.options), progress=progress, whole=bool(args.map))
        where = parse_slice(args.slice, report["shape"], report["shard_shape"]) if "stored" in report else None
    except (OSError, ValueError) as e:
        raise UsageError(str(e).splitlines()[0]) from None
    finally:
        for bar in bars:
            bar.close()
    if args.map:
        if where is None:
            raise UsageError(f"--map: {args.path} is not an array that can be shown (inspect says why)")
        try:
            picture = png(report, where)
        except ImportError:
            raise UsageError("--map needs matplotlib: pip install 'shardfs[map]'") from None
        try:
            with open(args.map, "wb") as f:
                f.write(picture)
        except OSError as e:
            raise UsageError(f"{args.map}: cannot write: {e.strerror}") from None
        width, height = SIZE
    print(json.dumps(report, indent=2) if args.json else format_text(printable_doc(report), where))
    if args.map:
        print(f"shardfs: wrote {args.map}, {width}x{height}", file=sys.stderr)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    """Print the status of one mount or of every mount of this user, once or every ``--watch`` s."""
    from shardfs.app.status_client import StatusError, all_statuses, clear_screen, format_text, status_of

    if args.watch is not None and not args.watch > 0:
        raise UsageError(f"--watch {args.watch:g}: not a positive number of seconds")
    clear = clear_screen() if args.watch and not args.json and sys.stdout.isatty() else ""
    while True:
        try:
            shown = [status_of(args.mnt)] if args.mnt else all_statuses()
        except StatusError as e:
            raise UsageError(str(e)) from None
        try:
            if args.json:
                print(json.dumps(shown[0] if args.mnt else shown, indent=2))
            else:
                texts = [format_text(printable_doc(doc)) for doc in shown]
                print(clear + ("\n\n".join(texts) if shown else "no shardfs mounts of this user"))
            sys.stdout.flush()
        except BrokenPipeError:  # ``| head``
            return 0
        if not args.watch:
            return 0
        time.sleep(args.watch)


def _cmd_umount(args: argparse.Namespace) -> int:
    """SIGTERM the daemon (it folds pending writes, then unmounts), showing the folds' progress
    when many chunks are pending (``FoldProgress``); after ``--timeout`` seconds SIGKILL it (the
    journal keeps every acknowledged change) and unmount lazily. Prints what is left in the
    journal and why; status 1 if anything is. A dead mount (its daemon gone) is detached
    (``_detach_dead``): status 0."""
    from shardfs.app.progress import FoldProgress  # (here: the other commands and the daemon need none of it)

    mnt = os.path.abspath(args.mnt)
    if _detach_dead(args.mnt, mnt):
        return 0
    if not _mounted(mnt):
        raise UsageError(f"{args.mnt}: not mounted")
    daemon = daemon_of(mnt)
    if daemon is None:
        result = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
        if result.returncode:
            raise UsageError(result.stderr.strip() or f"{args.mnt}: cannot unmount")
        return 0
    pid = daemon.pid
    found = daemon_journal(pid)
    try:
        pidfd = pidfd_of(daemon)
    except OSError as e:
        raise UsageError(f"{args.mnt}: its daemon cannot be reached: {e.strerror}") from None
    with contextlib.closing(_Fd(pidfd)):
        progress = FoldProgress(args.mnt, daemon.socket)
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        killed = False
        while running(pidfd) or os.path.ismount(mnt):
            progress.poll()
            if time.monotonic() > deadline:
                print(f"shardfs: {args.mnt}: pending writes not folded within {args.timeout:g} s: "
                      f"stopping daemon {pid}", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed = True
                _wait_gone(pidfd, 10.0)
                subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
                break
            time.sleep(0.05)
    lines = _kept_report(*found, _journal_owners(daemon), killed) if found is not None else []
    progress.close(bool(lines) or killed)
    for line in lines:
        print(f"shardfs: {printable(line)}", file=sys.stderr)
    if lines and found is not None:
        print(f"shardfs: they are folded by the next mount of {printable(found[0].name)}", file=sys.stderr)
    return 1 if lines or killed else 0


class _Fd(int):
    """An fd closed by ``contextlib.closing``."""

    def close(self) -> None:
        os.close(self)


def _wait_gone(pidfd: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while running(pidfd) and time.monotonic() < deadline:
        time.sleep(0.05)


def _journal_owners(daemon: Daemon) -> set[int]:
    """The processes whose journals hold a mount's changes: the daemon (the supervisor) and the
    workers its status document names."""
    doc = daemon.doc
    workers = [doc.get("worker") or {}, *(w for w in doc.get("workers") or [] if isinstance(w, dict))]
    return {daemon.pid, *(w["pid"] for w in workers if isinstance(w.get("pid"), int))}


def _kept_report(source: Source, root: str, pids: set[int], killed: bool) -> list[str]:
    """One line per shard of ``source`` whose changes are still in the journal of processes
    ``pids`` (under the journal root ``root``): how many, and why: the daemon's note (updated as
    ``flush`` goes), or, if a killed daemon left none, its records counted (those marked folded
    left out; their shards named as the source's stored ones if it is not remote)."""
    owners = {str(pid) for pid in pids}
    try:
        mine = [n for n in os.listdir(root) if n.rpartition("-")[2] in owners]
    except OSError:
        mine = []
    if not mine:
        return []
    # imported only for a journal left: they bring trio and crc32c, most of a clean umount's time
    from shardfs.app.replay import replay_target
    from shardfs.writes.journal import kept_line, read_kept

    pending, note = read_kept(os.path.join(root, mine[0]))
    if note or not killed:  # a killed daemon may not have written it: then count its records
        return [kept_line(key, n, reason) for key, (n, reason) in sorted(note.items())]
    lines = []
    with contextlib.ExitStack() as stack:
        # (a remote source is not contacted from here)
        storage = None if source.kind.remote else stack.enter_context(source.opened())
        for (array, shard), positions in sorted(pending.items()):
            try:
                target = None if storage is None else replay_target(storage, array, shard)
            except OSError:
                target = None
            key = target.key if target is not None else f"{array} shard {shard}"
            reason = note.get(key, (0, "not folded before the timeout"))[1]
            lines.append(kept_line(key, len(positions), reason))
    return lines


def daemon_journal(pid: int) -> tuple[Source, str] | None:
    """The source a daemon serves (a directory or a URL) and its journal root, from its
    command line (``... mount SRC MNT -f [-o journal_dir=DIR] ...``, relative paths against
    its cwd) and, for a URL, the endpoint its environment gave it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="surrogateescape") for a in f.read().split(b"\0")][:-1]
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = dict(v.decode(errors="surrogateescape").partition("=")[::2] for v in f.read().split(b"\0") if v)
        cwd = os.readlink(f"/proc/{pid}/cwd")
        args = _parser().parse_args(argv[argv.index("mount"):])
        parsed = options.parse(args.options)
        source = options.source(args.src if is_url(args.src) else os.path.join(cwd, args.src), parsed, environ,
                                args.resolved)
    except (OSError, ValueError, SystemExit):
        return None
    override = options.config(parsed).writes.journal_dir
    root = state.journal_dir(source.name, os.path.join(cwd, override) if override else None, source.endpoint)
    return source, root


if __name__ == "__main__":
    sys.exit(main())
