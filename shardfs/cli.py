"""Command line: ``shardfs mount | umount``; daemonizing, signals, logging.

``shardfs mount SRC MNT`` checks SRC, starts the daemon (this same program
with ``-f`` in a new session) and returns once the daemon reports, over a
pipe, that the mount is live or why it failed.
"""

from __future__ import annotations

import argparse
import errno
import functools
import json
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import time
from typing import Any

from shardfs import __version__
from shardfs.mounts import daemon_pid, fsname

log = logging.getLogger("shardfs")
OWN_OPTIONS = ("ro", "rw", "entry_timeout", "attr_timeout", "chunk_cache", "journal_dir")


class UsageError(Exception):
    """A problem with the user's input, reported as one line."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        print(_versions())
        return 0
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("shardfs: error: a command is required (mount, umount, inspect)", file=sys.stderr)
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
        description="Mount sharded Zarr v3 data as plain Zarr v2 arrays (FUSE).",
    )
    p.add_argument("--version", action="store_true", help="print versions and exit")
    sub = p.add_subparsers(dest="command")
    m = sub.add_parser("mount", help="mount SRC (a Zarr v3 group or array) on MNT")
    m.add_argument("src", metavar="SRC")
    m.add_argument("mnt", metavar="MNT")
    m.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    m.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="mount options: ro, entry_timeout=S, attr_timeout=S, chunk_cache=SIZE "
                        "(decoded-chunk cache, default 64M, 0 = off), and FUSE options such as allow_other")
    m.add_argument("--read-only", action="store_true", help="refuse every write (EROFS)")
    m.add_argument("--no-ome-translation", dest="ome", action="store_false",
                   help="show OME-Zarr 0.5 attributes as they are, not as OME-Zarr 0.4")
    m.add_argument("--debug", action="store_true", help="log every request")
    m.add_argument("--log-file", metavar="FILE", help="log here (default: stderr with -f, else syslog)")
    m.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    m.set_defaults(run=_cmd_mount)
    i = sub.add_parser("inspect", help="show the codecs, shapes and index of an array or shard")
    i.add_argument("path", metavar="PATH", help="a shard file, a shard directory in a mount, or an array")
    i.add_argument("--json", action="store_true", help="print JSON for scripts")
    i.set_defaults(run=_cmd_inspect)
    u = sub.add_parser("umount", help="flush pending writes and unmount MNT")
    u.add_argument("mnt", metavar="MNT")
    u.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the flush")
    u.set_defaults(run=_cmd_umount)
    return p


def _versions() -> str:
    import pyfuse3
    import zarr

    libfuse = subprocess.run(["pkg-config", "--modversion", "fuse3"], capture_output=True, text=True)
    return (f"shardfs {__version__}\npyfuse3 {pyfuse3.__version__}\nzarr {zarr.__version__}\n"
            f"libfuse {libfuse.stdout.strip() or 'unknown'}")


def check_source(src: str) -> dict[str, Any]:
    """The root ``zarr.json`` of SRC; ``UsageError`` if SRC is not a readable Zarr v3 node."""
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file or directory")
    if not os.path.isdir(src):
        raise UsageError(f"{src}: not a directory")
    meta = os.path.join(src, "zarr.json")
    try:
        with open(meta, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        v2 = any(os.path.exists(os.path.join(src, n)) for n in (".zarray", ".zgroup"))
        raise UsageError(f"{src}: {'Zarr v2 data, not Zarr v3' if v2 else 'not a Zarr v3 group or array (no zarr.json)'}") from None
    except PermissionError:
        raise UsageError(f"{meta}: permission denied") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{meta}: unreadable: {e}") from None
    if not isinstance(doc, dict) or doc.get("zarr_format") != 3 or doc.get("node_type") not in ("group", "array"):
        raise UsageError(f"{meta}: not Zarr v3 group or array metadata")
    return doc


def _split_options(raw: list[str]) -> tuple[dict[str, str], set[str]]:
    """Split ``-o`` values into shardfs's own options and options passed to libfuse."""
    own: dict[str, str] = {}
    fuse: set[str] = set()
    for group in raw:
        for opt in filter(None, group.split(",")):
            name, _, value = opt.partition("=")
            if name in OWN_OPTIONS:
                own[name] = value
            else:
                fuse.add(opt)
    for name in ("entry_timeout", "attr_timeout"):
        if name in own:
            try:
                float(own[name])
            except ValueError:
                raise UsageError(f"-o {name}={own[name]}: not a number") from None
    if "chunk_cache" in own:
        from shardfs.chunkcache import parse_size

        try:
            parse_size(own["chunk_cache"])
        except ValueError:
            raise UsageError(f"-o chunk_cache={own['chunk_cache']}: not a size (e.g. 64M)") from None
    return own, fuse


def _cmd_mount(args: argparse.Namespace) -> int:
    check_source(args.src)
    own, fuse_opts = _split_options(args.options)
    mnt = os.path.abspath(args.mnt)
    try:
        os.makedirs(mnt, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{args.mnt}: cannot create mountpoint: {e.strerror}") from None
    if os.path.ismount(mnt):
        raise UsageError(f"{args.mnt}: already a mountpoint")
    if args.foreground:
        return _run_daemon(args, mnt, own, fuse_opts)
    return _spawn_daemon(args)


def _spawn_daemon(args: argparse.Namespace) -> int:
    """Start the daemon in its own session and wait for it to report."""
    r, w = os.pipe()
    argv = [sys.executable, "-m", "shardfs", "mount", os.path.abspath(args.src), os.path.abspath(args.mnt),
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


def _run_daemon(args: argparse.Namespace, mnt: str, own: dict[str, str], fuse_opts: set[str]) -> int:
    """Serve the mount in this process until unmounted or signalled."""
    import pyfuse3
    import trio

    from shardfs import state
    from shardfs.fuse_ops import Operations, Timeouts
    from shardfs.source import Source
    from shardfs.view import View
    from shardfs.writeback import Writeback

    _setup_logging(args)
    read_only = args.read_only or "ro" in own
    timeouts = Timeouts(float(own.get("entry_timeout", Timeouts.entry)),
                        float(own.get("attr_timeout", Timeouts.attr)))
    source = Source(args.src)
    writeback = None
    if not read_only:
        writeback = Writeback(source, state.journal_dir(args.src, own.get("journal_dir")))
        legacy = state.legacy_journal(args.src)
        try:
            replayed = writeback.replay_sync(functools.partial(_replay_target, source),
                                             older=(legacy,) if legacy else ())
        except Exception as e:
            _report(args, f"error: {args.src}: cannot replay the write journal: {e}")
            return 1
        if legacy:
            state.remove_legacy(args.src)
            log.info("moved the write journal out of the source: %s replayed and removed", legacy)
        if replayed:
            log.info("replayed %d journalled chunk changes into their shards", replayed)
    from shardfs.chunkcache import DEFAULT_BYTES, ChunkCache, parse_size

    cache = ChunkCache(parse_size(own["chunk_cache"]) if "chunk_cache" in own else DEFAULT_BYTES)
    view = View(source, read_only=read_only, writeback=writeback, ome=args.ome, chunk_cache=cache)
    ops = Operations(view, timeouts, writeback)
    if writeback is not None:
        writeback.on_folded = ops.writer.folded
    options = set(pyfuse3.default_options) | {fsname(args.src), "subtype=shardfs"} | fuse_opts
    if read_only:
        options.add("ro")
    try:
        pyfuse3.init(ops, mnt, options)
    except RuntimeError as e:
        _report(args, f"error: {mnt}: cannot mount: {e}")
        return 1
    log.info("mounted %s on %s%s", os.path.abspath(args.src), mnt, " (read-only)" if read_only else "")
    _report(args, "ok")
    try:
        trio.run(_serve, ops, writeback)
    finally:
        pyfuse3.close(unmount=True)
        log.info("unmounted %s", mnt)
    return 0


async def _serve(ops: Any, writeback: Any) -> None:
    """Run the FUSE loop; on SIGINT/SIGTERM fold pending writes into the shards and end it.

    Pending writes are also folded when the loop ends otherwise (``fusermount3 -u``).
    """
    import pyfuse3
    import trio

    from shardfs import view as view_mod

    async with trio.open_nursery() as nursery:

        async def on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for sig in signals:
                    log.info("signal %d: flushing and unmounting", sig)
                    if writeback is not None:
                        await writeback.flush()
                    pyfuse3.terminate()
                    return

        nursery.start_soon(on_signal)
        nursery.start_soon(trio.to_thread.run_sync, view_mod.v2)  # zarr, before the first lookup needs it
        if writeback is not None:
            nursery.start_soon(writeback.run)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()
    if writeback is not None:
        writeback.on_folded = None  # the kernel connection is gone: nothing to invalidate
        await writeback.flush()


def _replay_target(source: Any, array_path: str, shard: tuple[int, ...]) -> Any:
    """Resolve a journalled shard to its rewrite target from the array's current metadata."""
    from shardfs.v2 import describe_array
    from shardfs.writes import shard_target

    try:
        doc = json.loads(source.read(f"{array_path}/zarr.json" if array_path else "zarr.json"))
        return shard_target(array_path, describe_array(doc).layout, shard)
    except (OSError, ValueError):
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
    from shardfs.report import format_text, inspect

    try:
        report = inspect(args.path)
    except (OSError, ValueError) as e:
        raise UsageError(str(e)) from None
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 0


def _cmd_umount(args: argparse.Namespace) -> int:
    mnt = os.path.abspath(args.mnt)
    if not os.path.ismount(mnt):
        raise UsageError(f"{args.mnt}: not mounted")
    pid = daemon_pid(mnt)
    if pid is None:
        result = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
        if result.returncode:
            raise UsageError(result.stderr.strip() or f"{args.mnt}: cannot unmount")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while _alive(pid) or os.path.ismount(mnt):
        if time.monotonic() > deadline:
            raise UsageError(f"{args.mnt}: daemon {pid} did not finish within {args.timeout:g} s")
        time.sleep(0.05)
    return 0


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
