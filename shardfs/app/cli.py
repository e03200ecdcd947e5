"""Command line: ``shardfs mount | umount | inspect | status``; daemonizing, signals, logging.

``shardfs mount SRC MNT`` checks SRC and the ``-o`` options, starts the daemon
(this same program with ``-f`` in a new session) and returns once the daemon
reports, over a pipe, that the mount is live or why it failed (libfuse's own
words included). ``shardfs SRC MNT [-o ...]`` is the same: the form
``mount -t fuse.shardfs`` (through mount.fuse3) and fstab use.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import json
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

from shardfs import __version__
from shardfs.app import options, state
from shardfs.app.mounts import daemon_pid, fsname
from shardfs.app.progress import FoldProgress
from shardfs.storage.source import Source
from shardfs.storage.urls import is_url

log = logging.getLogger("shardfs")
COMMANDS = ("mount", "umount", "inspect", "status")
BARE_FORM = ("`shardfs SRC MNT [-o OPT,...]` is `shardfs mount SRC MNT ...` "
             "(the form mount -t fuse.shardfs and /etc/fstab use).")
UMOUNT_TIMEOUT = 60.0
PROGRESS_MIN = 100  # shard indexes to read before inspect shows a progress bar


class UsageError(Exception):
    """A problem with the user's input, reported as one line."""


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
        print(f"shardfs: error: {e}", file=sys.stderr)
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
    if source.url:
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
    from shardfs.storage.objects import StorageUnavailable

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
        source = Source.parse(args.src, opts.own)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.ready_fd is None or not source.url:  # a daemon we spawned: its parent checked the store
        check_source(args.src, source)
    mnt = os.path.abspath(args.mnt)
    try:
        os.makedirs(mnt, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{args.mnt}: cannot create mountpoint: {e.strerror}") from None
    if os.path.ismount(mnt):
        raise UsageError(f"{args.mnt}: already a mountpoint")
    if args.foreground:
        return _run_daemon(args, mnt, opts, source)
    return _spawn_daemon(args, source)


def _spawn_daemon(args: argparse.Namespace, source: Source) -> int:
    """Start the daemon in its own session and wait for it to report.

    The daemon logs to ``--log-file``, else to syslog, else (no ``/dev/log``, as in
    many containers) to ``log`` in the source's state directory, which is said
    on stderr once the mount is live (a failure is one line: its reason)."""
    fallback = not args.log_file and not os.path.exists("/dev/log")
    if fallback:
        args.log_file = state.log_file(source.name, source.endpoint)
        try:
            os.makedirs(os.path.dirname(args.log_file), mode=0o700, exist_ok=True)
        except OSError as e:
            raise UsageError(f"{os.path.dirname(args.log_file)}: cannot create the state directory: "
                             f"{e.strerror}") from None
    r, w = os.pipe()
    # -P: the working directory is not put on the daemon's sys.path (a ``trio.py`` there
    # must not replace a module the daemon imports).
    argv = [sys.executable, "-P", "-m", "shardfs", "mount", source.name, os.path.abspath(args.mnt),
            "-f", "--ready-fd", str(w)]
    for opt in args.options:
        argv += ["-o", opt]
    argv += ["--read-only"] * args.read_only + ["--debug"] * args.debug + ["--no-ome-translation"] * (not args.ome)
    argv += ["--log-file", os.path.abspath(args.log_file)] if args.log_file else []
    with open(os.devnull, "r+b") as null:
        proc = subprocess.Popen(argv, stdin=null, stdout=null, stderr=null, pass_fds=(w,),
                                start_new_session=True)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        report = pipe.readline().decode().strip()
    if report == "ok":
        if fallback:
            print(f"shardfs: no syslog (/dev/log): the daemon logs to {args.log_file}", file=sys.stderr)
        return 0
    proc.wait()
    raise UsageError(report.removeprefix("error: ") or f"daemon exited with status {proc.returncode}")


def _setup_logging(args: argparse.Namespace) -> None:
    if args.log_file:
        handler: logging.Handler = logging.FileHandler(args.log_file)
    elif args.ready_fd is None:
        handler = logging.StreamHandler(sys.stderr)
    elif os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler(address="/dev/log")
    else:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s shardfs[%(process)d] %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if args.debug else logging.INFO)
    if not args.debug:
        logging.getLogger("pyfuse3").setLevel(logging.WARNING)


def _run_daemon(args: argparse.Namespace, mnt: str, opts: options.Parsed, source: Source) -> int:
    """Serve the mount in this process until unmounted or signalled."""
    from shardfs.kernel.fuse_ops import Timeouts

    args.debug = args.debug or "debug" in opts.own
    try:
        _setup_logging(args)
    except OSError as e:
        _report(args, f"error: {args.log_file}: cannot open the log file: {e.strerror}")
        return 1
    own = opts.own
    if opts.ignored:
        log.debug("ignored mount options: %s", ",".join(opts.ignored))
    read_only = args.read_only or opts.read_only or source.web  # a web server takes no writes
    timeouts = Timeouts(float(own.get("entry_timeout", Timeouts.entry)),
                        float(own.get("attr_timeout", Timeouts.attr)))
    with contextlib.ExitStack() as cleanup:
        storage = cleanup.enter_context(source.opened(version_ttl=timeouts.attr, list_ttl=timeouts.entry))
        writeback = None
        if not read_only:
            try:
                writeback = _writeback(source, storage, own.get("journal_dir"), cleanup)
            except UsageError as e:
                _report(args, f"error: {e}")
                return 1
            except Exception as e:
                _report(args, f"error: {args.src}: cannot replay the write journal: {e}")
                return 1
        return _mount_and_serve(args, mnt, opts, source, storage, writeback, timeouts)


def _writeback(source: Source, storage: Any, journal_dir: str | None, cleanup: contextlib.ExitStack) -> Any:
    """The mount's ``Writeback``, journalling into a directory of its own under the source's
    journal root (removed at exit if empty), after replaying into the shards what killed
    daemons left there and what an earlier version left in ``SRC/.shardfs/journal``."""
    from shardfs.writes import journal
    from shardfs.writes.writeback import Writeback

    root = state.journal_dir(source.name, journal_dir, source.endpoint)
    try:
        claim = journal.claim(root)
    except OSError as e:
        raise UsageError(f"{root}: cannot create the write journal: {e.strerror} "
                         "(-o journal_dir=DIR puts it elsewhere)") from None
    cleanup.callback(claim.release)
    writeback = Writeback(storage, claim.directory)
    legacy = state.legacy_journal(source.name)
    replayed = writeback.replay_sync(functools.partial(_replay_target, storage),
                                     older=((legacy,) if legacy else ()) + tuple(claim.orphans))
    claim.drop_orphans()
    if legacy:
        state.remove_legacy(source.name)
        log.info("moved the write journal out of the source: %s replayed and removed", legacy)
    if replayed:
        log.info("replayed %d journalled chunk changes into their shards", replayed)
    return writeback


def _mount_and_serve(args: argparse.Namespace, mnt: str, opts: options.Parsed, source: Source, storage: Any,
                     writeback: Any, timeouts: Any) -> int:
    """Mount and serve until unmounted or signalled; 1 if the mount failed (reported).

    zarr-python (``shardfs.tree.view.v2``: 0.15-0.3 s of CPU, more once its files have left the
    page cache) is imported before the mount goes live: the first lookup of any node needs
    it, and a client reading right after ``shardfs mount`` returned would wait for it
    (measured: 0.36 s of a cold ``cat`` of 3072 chunk files; the mount takes 0.1 s longer)."""
    import pyfuse3
    import trio

    from shardfs.reads.chunkcache import DEFAULT_BYTES, ChunkCache, parse_size
    from shardfs.kernel.fuse_ops import Operations
    from shardfs.reads.factory import make_reads
    from shardfs.app.status import Status
    from shardfs.tree.view import View, v2

    own = opts.own
    read_only = writeback is None
    cache = ChunkCache(parse_size(own["chunk_cache"]) if "chunk_cache" in own else DEFAULT_BYTES)
    try:
        ranges = _range_cache(source, own)
    except ValueError as e:
        _report(args, f"error: -o {e}")
        return 1
    ome = args.ome and "no_ome_translation" not in own
    view = View(storage, read_only=read_only, writeback=writeback, ome=ome, c_order="c_order" in own,
                reads=make_reads(storage, cache=ranges, chunk_cache=cache))
    ops = Operations(view, timeouts, writeback, spill_dir=state.spill_dir(source.name, source.endpoint))
    if writeback is not None and ops.writer is not None:
        writeback.on_folded = ops.writer.folded
        if "shard_size" in own:
            ops.writer.shard_bytes = max(1, parse_size(own["shard_size"]))
    v2()  # before going live (see above)
    fuse_opts = set(pyfuse3.default_options) | {fsname(source.name), "subtype=shardfs"} | set(opts.fuse)
    if read_only:
        fuse_opts.add("ro")
    with _stderr_captured() as said:
        try:
            pyfuse3.init(ops, mnt, fuse_opts)
        except RuntimeError as e:
            failed: RuntimeError | None = e
        else:
            failed = None
    libfuse = "; ".join(said)
    if failed is not None:
        _report(args, f"error: {mnt}: cannot mount: {libfuse + f' ({failed})' if libfuse else failed}")
        return 1
    if libfuse:
        log.warning("libfuse: %s", libfuse)
    log.info("mounted %s on %s%s", source.name, mnt, " (read-only)" if read_only else "")
    shown = {**own, **{o.partition("=")[0]: o.partition("=")[2] for o in opts.fuse}}
    status = Status(ops, mnt, source.name, source.endpoint, read_only, shown,
                    state.status_socket(source.name, source.endpoint, os.getpid()),
                    float(own["stats_interval"]) if "stats_interval" in own else None)
    _report(args, "ok")
    try:
        trio.run(_serve, ops, writeback, status)
    finally:
        pyfuse3.close(unmount=True)
        log.info("unmounted %s", mnt)
        if ranges is not None:
            ranges.flush()  # the disk cache gets the ranges fetched last
    return 0


def _range_cache(source: Source, own: dict[str, str]) -> Any:
    """An object store's cache of fetched ranges (``-o cache_size``, ``-o cache_dir``); None for a
    directory. ``ValueError`` (one line) if ``cache_dir`` cannot be used."""
    if not source.url:
        return None
    from shardfs.reads.chunkcache import parse_size
    from shardfs.reads.rangecache import RangeCache
    from shardfs.reads.objects import DEFAULT_CACHE_BYTES

    size = parse_size(own["cache_size"]) if "cache_size" in own else DEFAULT_CACHE_BYTES
    return RangeCache(size, own.get("cache_dir"))


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """Collect what is written to file descriptor 2 meanwhile (libfuse and fusermount3 print
    their reasons there) into the yielded list, one stripped line each, at exit."""
    said: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        os.dup2(tmp.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            said += [line.strip() for line in tmp.read().decode(errors="replace").splitlines() if line.strip()]


async def _serve(ops: Any, writeback: Any, status: Any) -> None:
    """Run the FUSE loop and answer ``shardfs status`` (``status``); on SIGINT/SIGTERM fold
    pending writes into the shards and end it.

    Pending writes are also folded when the loop ends otherwise (``fusermount3 -u``).
    Changes that cannot be folded stay in the journal (``Writeback.flush`` says why).
    """
    import pyfuse3
    import trio

    from shardfs.kernel import fuseloop

    flushed = False
    async with trio.open_nursery() as nursery:

        async def on_signal() -> None:
            nonlocal flushed
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for sig in signals:
                    log.info("signal %d: flushing and unmounting", sig)
                    if writeback is not None:
                        await writeback.flush()
                        flushed = True
                    pyfuse3.terminate()
                    return

        nursery.start_soon(on_signal)
        nursery.start_soon(status.run)
        if writeback is not None:
            nursery.start_soon(writeback.run)
        await fuseloop.main()  # pyfuse3.main() with a cheaper read lock
        nursery.cancel_scope.cancel()
    if writeback is not None and not flushed:
        writeback.on_folded = None  # the kernel connection is gone: nothing to invalidate
        await writeback.flush()


def _replay_target(source: Any, array_path: str, shard: tuple[int, ...]) -> Any:
    """Resolve a journalled shard to its rewrite target from the array's current metadata: None
    if the array is gone or its metadata is bad; ``Unusable`` if its ``zarr.json`` is there but
    cannot be read now (not a regular file, behind a symlink out of the source)."""
    from shardfs.tree.metadata import BadMetadata, parse
    from shardfs.storage import Unusable
    from shardfs.format.v2 import describe_array
    from shardfs.tree.writer import shard_target

    try:
        data, _version = source.read_all(f"{array_path}/zarr.json" if array_path else "zarr.json")
        doc = parse(data)
        return shard_target(array_path, describe_array(doc).layout, shard)
    except Unusable:
        raise
    except (OSError, ValueError, BadMetadata):
        return None


def _report(args: argparse.Namespace, line: str) -> None:
    if args.ready_fd is None:
        if line != "ok":
            print(f"shardfs: {line}", file=sys.stderr)
        return
    try:
        os.write(args.ready_fd, (line + "\n").encode())
        os.close(args.ready_fd)
    except OSError:
        pass


def _cmd_inspect(args: argparse.Namespace) -> int:
    """Print what ``shardfs.app.report.inspect`` finds; draw ``--map``. Reading many shard indexes
    shows a progress bar on a terminal's stderr."""
    from shardfs.format.gridmap import parse_slice, save_png
    from shardfs.app.report import format_text, inspect

    bars: list[Any] = []

    def progress(total: int) -> Any:
        if total < PROGRESS_MIN or not sys.stderr.isatty():
            return None
        from tqdm import tqdm

        bars.append(tqdm(total=total, unit="shard", desc="reading shard indexes", file=sys.stderr, leave=False))
        return bars[-1].update

    try:
        report = inspect(args.path, options.parse(args.options).own, progress=progress)
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
            save_png(report, where, args.map)
        except ImportError:
            raise UsageError("--map needs matplotlib: pip install 'shardfs[map]'") from None
        except OSError as e:
            raise UsageError(f"{args.map}: cannot write: {e.strerror}") from None
    print(json.dumps(report, indent=2) if args.json else format_text(report, where))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    """Print the status of one mount or of every mount of this user, once or every ``--watch`` s."""
    from shardfs.app.status_client import StatusError, all_statuses, clear_screen, format_text, status_of

    if args.watch is not None and not args.watch > 0:
        raise UsageError(f"--watch {args.watch:g}: not a positive number of seconds")
    clear = clear_screen() if args.watch and not args.json and sys.stdout.isatty() else ""
    while True:
        try:
            docs: Any = status_of(args.mnt) if args.mnt else all_statuses()
        except StatusError as e:
            raise UsageError(str(e)) from None
        shown = [docs] if args.mnt else docs
        try:
            if args.json:
                print(json.dumps(docs, indent=2))
            else:
                print(clear + ("\n\n".join(map(format_text, shown)) if shown else "no shardfs mounts of this user"))
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
    journal and why; status 1 if anything is."""
    mnt = os.path.abspath(args.mnt)
    if not os.path.ismount(mnt):
        raise UsageError(f"{args.mnt}: not mounted")
    pid = daemon_pid(mnt)
    if pid is None:
        result = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
        if result.returncode:
            raise UsageError(result.stderr.strip() or f"{args.mnt}: cannot unmount")
        return 0
    found = daemon_journal(pid)
    sockets = state.status_sockets(pid)
    progress = FoldProgress(args.mnt, sockets[0] if sockets else None)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    killed = False
    while _alive(pid) or os.path.ismount(mnt):
        progress.poll()
        if time.monotonic() > deadline:
            print(f"shardfs: {args.mnt}: pending writes not folded within {args.timeout:g} s: "
                  f"stopping daemon {pid}", file=sys.stderr)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            killed = True
            _wait_gone(pid, 10.0)
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
            break
        time.sleep(0.05)
    lines = _kept_report(*found, pid, killed) if found is not None else []
    progress.close(bool(lines) or killed)
    for line in lines:
        print(f"shardfs: {line}", file=sys.stderr)
    if lines and found is not None:
        print(f"shardfs: they are folded by the next mount of {found[0]}", file=sys.stderr)
    return 1 if lines or killed else 0


def _wait_gone(pid: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _kept_report(src: str, root: str, pid: int, killed: bool) -> list[str]:
    """One line per shard whose changes are still in the journal of daemon ``pid`` (under the
    journal root ``root``): how many, and why: the daemon's note (updated as ``flush`` goes),
    or, if a killed daemon left none, its records counted (those marked folded left out)."""
    from shardfs.writes.journal import kept_line, read_kept
    from shardfs.storage.local import LocalStorage

    try:
        mine = [n for n in os.listdir(root) if n.endswith(f"-{pid}")]
    except OSError:
        mine = []
    if not mine:
        return []
    pending, note = read_kept(os.path.join(root, mine[0]))
    if note or not killed:  # a killed daemon may not have written it: then count its records
        return [kept_line(key, n, reason) for key, (n, reason) in sorted(note.items())]
    storage = None if is_url(src) else LocalStorage(src)  # an object store: not contacted from here
    lines = []
    for (array, shard), positions in sorted(pending.items()):
        try:
            target = None if storage is None else _replay_target(storage, array, shard)
        except OSError:
            target = None
        key = target.key if target is not None else f"{array} shard {shard}"
        reason = note.get(key, (0, "not folded before the timeout"))[1]
        lines.append(kept_line(key, len(positions), reason))
    return lines


def daemon_journal(pid: int) -> tuple[str, str] | None:
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
        own = options.parse(args.options).own
        source = Source.parse(args.src if is_url(args.src) else os.path.join(cwd, args.src), own, environ)
    except (OSError, ValueError, SystemExit):
        return None
    override = own.get("journal_dir")
    root = state.journal_dir(source.name, os.path.join(cwd, override) if override else None, source.endpoint)
    return source.name, root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
