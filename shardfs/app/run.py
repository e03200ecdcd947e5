"""Running a mount: the daemon started in its own session, its logging, the mount's layers
built by the composition root (``shardfs.app.compose``), the mount going live with its status
socket, the FUSE loop and its signals.

The daemon reports to the ``shardfs mount`` that started it over a pipe (``--ready-fd``):
``ok`` once the mount is live, else ``error: `` and one line saying why. An object store is
checked by ``shardfs mount`` while the daemon starts (its imports and its zygote's): the daemon
does nothing before it reads "go" on another pipe (``--go-fd``), and ends at once if it is
closed instead (measured: an S3 mount live after 0.85 s instead of 0.90, 3 alternations of 4).

With a pyfuse3 that can take a connection over (``pyfuse3.takeover``: scripts/pyfuse3 builds
it), the daemon is a supervisor (``shardfs.app.supervisor``) that mounts and keeps the
connection, and serves it through a worker, this same command run with ``--worker FD``: the
worker builds the layers, takes the connection, answers (or replays) the kernel's FUSE_INIT
and serves; a worker replacing a dead one first takes over the numbers the dead one gave the
kernel (``Reopen.restore``) and has the kernel resend what it had read.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterator

from shardfs.app import early, options, state
from shardfs.app.metrics import Exporter, parse_address
from shardfs.app.mounts import device, fsname
from shardfs.app.usage import UsageError
from shardfs.base.cores import available as available_cores
from shardfs.config import Config, default_workers
from shardfs.format.printable import printable
from shardfs.base import private
from shardfs.storage import sharedshards
from shardfs.storage.source import Source

if TYPE_CHECKING:
    from shardfs.app.compose import Composed

log = logging.getLogger("shardfs")


def spawn_daemon(args: argparse.Namespace, source: Source, check: Callable[[], Any] | None = None) -> int:
    """Start the daemon in its own session and wait for it to report; ``check`` (an object
    store's: its imports and a request, a quarter of a second) runs meanwhile, while the daemon
    and its zygote import, and the daemon goes on only once it passed (``--go-fd``; if it
    raises, the daemon ends without a word and the exception is raised here).

    The daemon logs to ``--log-file``, else to syslog, else (no ``/dev/log``, as in
    many containers) to ``log`` in the source's state directory (doc/TROUBLESHOOTING says so;
    ``--debug`` also says it on stderr once the mount is live). A failure is one line: its reason."""
    fallback = not args.log_file and not os.path.exists("/dev/log")
    if fallback:
        args.log_file = state.log_file(source.name, source.endpoint)
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    worker = _daemon_argv(args, source)
    argv = worker + ["--ready-fd", str(w), "--go-fd", str(go_r)]
    env = {**os.environ, early.ENV: json.dumps(worker)}  # its zygote starts first (``shardfs.app.early``)
    with open(os.devnull, "r+b") as null:
        proc = subprocess.Popen(argv, stdin=null, stdout=null, stderr=null, pass_fds=(w, go_r),
                                start_new_session=True, env=env)
    os.close(w)
    os.close(go_r)
    try:
        if check is not None:
            check()
        if fallback:
            _state_dir(args.log_file)
    except BaseException:
        os.close(go_w)
        os.close(r)
        proc.wait()
        raise
    os.write(go_w, b"go")
    os.close(go_w)
    with os.fdopen(r, "rb") as pipe:
        report = pipe.readline().decode().strip()
    if report == "ok":
        if fallback and args.debug:
            print(f"shardfs: no syslog (/dev/log): the daemon logs to {args.log_file}", file=sys.stderr)
        return 0
    proc.wait()
    raise UsageError(report.removeprefix("error: ") or f"daemon exited with status {proc.returncode}")


def _state_dir(log_file: str) -> None:
    """Make the state directory a spawned daemon logs in (no syslog); ``UsageError`` if it cannot be."""
    try:
        state.private_dir(os.path.dirname(log_file))
    except private.Refused as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"{os.path.dirname(log_file)}: cannot create the state directory: {e.strerror}") from None


def take_over(args: argparse.Namespace, mnt: str, opts: options.Parsed, source: Source) -> bool:
    """``shardfs mount`` on live mount ``mnt``: True once a supervised mount of the same source
    was handed to a new worker with these options (``shardfs.app.handover``); False if ``mnt``
    is not one (another source, an unsupervised daemon). ``UsageError`` says why not."""
    from shardfs.app.handover import hand_over

    read_only = args.read_only or options.config(opts).read_only or not source.kind.writable
    if not args.log_file and not os.path.exists("/dev/log"):
        args.log_file = state.log_file(source.name, source.endpoint)  # where a spawned daemon logs
    return hand_over(args.mnt, mnt, source, list(opts.fuse), read_only,
                     _daemon_argv(args, source))


def _daemon_argv(args: argparse.Namespace, source: Source) -> list[str]:
    """``shardfs mount SRC MNT -f`` with the options of ``args``, for a daemon or a worker, and
    the settings found for ``source`` (``--resolved``: its processes look for none).
    -P: the working directory is not put on the daemon's sys.path (a ``trio.py`` there must
    not replace a module the daemon imports)."""
    argv = [sys.executable, "-P", "-m", "shardfs", "mount", source.name, os.path.abspath(args.mnt), "-f"]
    resolved = source.resolved()
    argv += ["--resolved", resolved] if resolved is not None else []
    for opt in args.options:
        argv += ["-o", opt]
    argv += ["--read-only"] * args.read_only + ["--debug"] * args.debug + ["--no-ome-translation"] * (not args.ome)
    argv += ["--log-file", os.path.abspath(args.log_file)] if args.log_file else []
    return argv


def pyfuse3_version() -> str:
    """The installed pyfuse3's version ("" if none), whose local label names the patches of
    scripts/pyfuse3 it was built with: from its ``NAME-VERSION.dist-info`` directory beside the
    package (the wheel's layout), found without importing pyfuse3 (a quarter of a second) or
    ``importlib.metadata`` (its import and its search of every path: 30-40 ms of every
    supervisor's CPU, measured, before the mount goes live)."""
    import importlib.util

    spec = importlib.util.find_spec("pyfuse3")
    if spec is None or spec.origin is None:
        return ""
    # (beside the package's directory, or beside the module of a pyfuse3 built as one file)
    where = os.path.dirname(spec.origin if spec.submodule_search_locations is None else os.path.dirname(spec.origin))
    with contextlib.suppress(OSError):
        for name in os.listdir(where):
            if name.startswith("pyfuse3-") and name.endswith(".dist-info"):
                return name.removeprefix("pyfuse3-").removesuffix(".dist-info")
    return ""


def supervised() -> bool:
    """True if the installed pyfuse3 can take a connection over (``pyfuse3.takeover``, from
    scripts/pyfuse3): then ``shardfs mount`` leaves a supervisor and a worker."""
    return "takeover" in pyfuse3_version()


def _setup_logging(args: argparse.Namespace) -> None:
    """Log to ``--log-file`` (a file of this user's own, never through a symlink: ``private``
    raises ``Refused``), else stderr (``-f``), else syslog."""
    if args.log_file:
        fd = private.open_path(args.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        handler: logging.Handler = logging.StreamHandler(open(fd, "a", encoding="utf-8", errors="backslashreplace"))
    elif args.ready_fd is None:
        handler = logging.StreamHandler(sys.stderr)
    elif os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler(address="/dev/log")
    else:
        handler = logging.NullHandler()
    handler.setFormatter(_Printable("%(asctime)s shardfs[%(process)d] %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if args.debug else logging.INFO)
    pyfuse3_log = logging.getLogger("pyfuse3")
    if not args.debug:
        pyfuse3_log.setLevel(logging.WARNING)
    pyfuse3_log.addFilter(_abandoned)


def _abandoned(record: logging.LogRecord) -> bool:
    """pyfuse3's ``fuse_OP(): fuse_reply_* failed with No such file or directory`` made a DEBUG
    record (shown with ``-o debug`` only): the kernel no longer waits for that request (its
    caller was interrupted, or a worker's RESEND moved it back to the queue:
    ``kernel.forward``'s ``MOVED``), which is no error."""
    if not record.getMessage().endswith("fuse_reply_* failed with " + os.strerror(errno.ENOENT)):
        return True
    record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    return logging.getLogger("pyfuse3").isEnabledFor(logging.DEBUG)


class _Printable(logging.Formatter):
    """Each record's message made ``printable``: names and text from the source (or a client)
    never forge a line or send a terminal escape. A traceback below it keeps its lines (the
    frames are shardfs's own code); each exception's own text in it is made ``printable``."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        kept = ("Traceback (most recent call last):\n",
                "\nThe above exception was the direct cause of the following exception:\n\n",
                "\nDuring handling of the above exception, another exception occurred:\n\n")
        parts = []
        for part in traceback.TracebackException(ei[0], ei[1], ei[2]).format():
            if part in kept or part.startswith('  File "'):
                parts.append(part)
            else:  # "Type: message": the message may hold what the source named
                parts.append(printable(part.rstrip("\n")) + "\n")
        return "".join(parts).rstrip("\n")


def run_daemon(args: argparse.Namespace, mnt: str, opts: options.Parsed, source: Source) -> int:
    """Serve the mount in this process until unmounted or signalled; with ``--worker``, as a
    supervisor's worker; else, when ``supervised()``, be the supervisor of such workers."""
    if args.worker is not None:
        from shardfs.app.supervisor import Connection

        args.connection = Connection(args.worker)
    else:
        args.connection = None
    cfg = options.config(opts)
    args.debug = args.debug or cfg.debug
    try:
        _setup_logging(args)
    except private.Refused as e:
        _report(args, f"error: {e}")
        return 1
    except OSError as e:
        _report(args, f"error: {args.log_file}: cannot open the log file: {e.strerror}")
        return 1
    if opts.ignored:
        log.debug("ignored mount options: %s", ",".join(opts.ignored))
    read_only = args.read_only or cfg.read_only or not source.kind.writable  # a web server takes no writes
    if args.connection is None and cfg.workers is not None and cfg.workers > 1:
        why = workers_refused(read_only)
        if why is not None:
            _report(args, f"error: -o workers={cfg.workers}: {why}")
            return 1
    if args.connection is None and supervised():
        return _supervise(args, mnt, opts, read_only, source, _workers(cfg, read_only, source),
                          elastic=cfg.workers is None and not os.environ.get("SHARDFS_TEST_WORKERS"),
                          shard_ring=sharedshards.split(cfg.reads.cache_size)[0]
                          if read_only and source.kind.remote else 0)
    early.discard()  # (no supervision: this process serves)
    if args.connection is None or args.connection.index == 0:  # (the mount's warnings: not each worker's)
        source.warn()
    from shardfs.app.compose import ReplayFailed, compose
    from shardfs.tree.ledger import Ledger

    cfg = dataclasses.replace(cfg, read_only=read_only, debug=args.debug,
                              tree=dataclasses.replace(cfg.tree, ome=args.ome and cfg.tree.ome))
    ledger = None
    pages = None  # N workers: the mount's table of the kernel's page cache
    versions_fd = None  # ... and the memfd of their table of versions (``Source.opened``)
    shards_fd = None  # ... and of the shards fetched whole (a read-only mount of a remote source)
    if args.connection is not None:
        args.ledger = state.ledger_file(source.name, source.endpoint, os.getppid())
        conn = args.connection
        # (a supervisor of an older package gives no memfd: a file in the state directory)
        ledger = Ledger(args.ledger) if conn.ledger is None else Ledger(fd=conn.ledger)
        if conn.count > 1:
            ledger.share(conn.index, conn.count)
            try:  # before anything is given a number: the workers agree on each one (``Ledger.locked``)
                state.private_dir(os.path.dirname(args.ledger))
                ledger.start()
            except (OSError, private.Refused) as e:
                _report(args, f"error: {args.ledger}: cannot create: {getattr(e, 'strerror', None) or e}")
                return 1
            if conn.pages is not None:  # (a supervisor of an older package gives none: direct I/O)
                from shardfs.kernel.pagetable import PageTable

                try:
                    pages = PageTable(conn.pages)
                    versions_fd, shards_fd = conn.versions, conn.shards
                except (OSError, ValueError) as e:
                    log.warning("the page-cache table cannot be used (files are read with direct I/O): %s", e)
    from shardfs.kernel.owner import OWNER

    try:
        with contextlib.ExitStack() as cleanup:
            try:
                replaces = args.connection is not None and args.connection.replaces
                writes = ledger is None or not ledger.shared or ledger.index == OWNER  # (``kernel.owner``)
                mount = compose(cfg, source, cleanup, ledger, adopt=replaces, writes=writes, pages=pages,
                                versions_fd=versions_fd, shards_fd=shards_fd)
            except UsageError as e:
                _report(args, f"error: {e}")
                return 1
            except ReplayFailed as e:
                _report(args, f"error: {args.src}: cannot replay the write journal: {e}")
                return 1
            if ledger is not None and ledger.shared:
                try:
                    marks = _share(args, mount, ledger, source, read_only)
                    if marks is not None:
                        cleanup.callback(marks.close)
                except OSError as e:
                    _report(args, f"error: {e.filename}: cannot create: {e.strerror or e}")
                    return 1
            code = _mount_and_serve(args, mnt, opts, cfg, mount)
    except BaseException as e:  # whatever ends the daemon says why where its log is read
        cause = e
        while isinstance(cause, BaseExceptionGroup) and len(cause.exceptions) == 1:  # trio's nurseries
            cause = cause.exceptions[0]
        log.critical("the daemon stops: %s: %s", type(cause).__name__, cause, exc_info=True)
        raise
    if args.connection is not None:
        # a worker, its mount's layers closed: no interpreter teardown (zarr, numpy: 0.4 s, seconds
        # on a loaded machine), which the supervisor waits for before it ends the mount
        logging.shutdown()
        os._exit(code)
    return code


def preload(source: Source) -> None:
    """Import what a worker of ``source`` runs, opening nothing (a zygote: ``shardfs.app.zygote``)."""
    import pyfuse3  # noqa: F401
    import trio  # noqa: F401

    from shardfs.app import compose, status, supervisor  # noqa: F401  (compose: zarr-python too)
    from shardfs.kernel import fuseloop  # noqa: F401

    source.kind.imports()  # its storage modules (s3: the credential chain; each worker resolves it)


def _share(args: argparse.Namespace, mount: Composed, ledger: Any, source: Source, read_only: bool) -> Any:
    """One of N workers (``shardfs.kernel.route``): its links to the others and the socket it
    answers them on (``args.peer_socket``); on a writable mount the marks of what was changed
    through the mount, the owner marking the arrays the journal's replay left pending. What to
    close (the marks), or None."""
    from shardfs.kernel.forward import Peers
    from shardfs.kernel.homes import Homes
    from shardfs.kernel.owner import OWNER, Areas, Marks
    from shardfs.kernel.route import Route
    from shardfs.reads.objects import ObjectReads

    sup = os.getppid()
    args.peer_socket = state.worker_socket(source.name, source.endpoint, sup, ledger.index)
    from shardfs.app import fusedev

    conn = args.connection  # (its descriptor is given later: ``Connection.connect``)
    peers = Peers(lambda slot: state.worker_socket(source.name, source.endpoint, sup, slot),
                  lambda: conn.fd < 0 or fusedev.connected(conn.fd))  # (unmounted: no worker comes back)
    marks = None if read_only else Marks(state.marks_file(source.name, source.endpoint, sup))
    if marks is not None:
        marks.start()
        if ledger.index == OWNER and mount.writeback is not None:
            for path in mount.writeback.dirty_arrays():
                marks.note(path)
    areas = None if marks is None else Areas(mount.tree.nodes, marks)
    homes = None
    reads = mount.tree.reads
    if read_only and isinstance(reads, ObjectReads):  # a remote source (``shardfs.kernel.homes``)
        homes = Homes(mount.tree.names, mount.tree.nodes, ledger.index, ledger.count, mount.tree.indexes, reads)
        mount.tree.prefetch.share(ledger.index, ledger.count)
    mount.ops.route = Route(ledger.index, ledger.owner, peers, areas, mount.ops.reopen.here, homes,
                            mount.tree.nodes.made_by)
    return marks


def workers_refused(read_only: bool) -> str | None:
    """Why ``-o workers=N`` (N > 1) cannot serve this mount, or None."""
    if "workers" not in pyfuse3_version():
        return "needs the pyfuse3 that scripts/install builds (doc/INSTALL.md)"
    return None


def _workers(cfg: Config, read_only: bool, source: Source) -> int:
    """The workers of a supervised mount: ``-o workers=N``; by default (``-o workers=auto``), of a
    local directory ``default_workers()`` if this pyfuse3 can serve them, else one. A source
    reached over the network (object store, web) gets one: 2 workers over this project's S3
    server took 1.4-1.6x the time of one, for 1.7-2.3x the CPU a chunk (doc/BENCHMARKING.md).
    ``SHARDFS_TEST_CORES=N`` (the tests) counts N cores instead of this machine's;
    ``SHARDFS_TEST_WORKERS=N`` gives any source N workers, all reading the connection (the
    suite run again with 2: tests/README.md)."""
    if cfg.workers is not None:
        return cfg.workers
    if os.environ.get("SHARDFS_TEST_WORKERS") and workers_refused(read_only) is None:
        return int(os.environ["SHARDFS_TEST_WORKERS"])
    if source.kind.remote or workers_refused(read_only) is not None:
        return 1
    cores = os.environ.get("SHARDFS_TEST_CORES")
    return default_workers(int(cores) if cores else available_cores())


def _supervise(args: argparse.Namespace, mnt: str, opts: options.Parsed, read_only: bool, source: Source,
               workers: int = 1, elastic: bool = False, shard_ring: int = 0) -> int:
    """Be the supervisor of ``mnt`` (``shardfs.app.supervisor``) until the mount ends; ``elastic``
    (``-o workers=auto``): the workers past the first serve only while requests queue up;
    ``shard_ring``: the bytes N workers keep the shards of a remote source fetched whole in
    (``shardfs.storage.sharedshards``; 0: none)."""
    from shardfs.app.supervisor import Supervisor

    ledger = state.ledger_file(source.name, source.endpoint, os.getpid())
    with contextlib.suppress(OSError):
        os.unlink(ledger)  # left by a killed supervisor of the same pid number
    sup = Supervisor(_daemon_argv(args, source), mnt, device(source.name),
                     ["default_permissions", *opts.fuse], read_only, lambda line: _report(args, line),
                     state.status_socket(source.name, source.endpoint, os.getpid()),
                     state.takeover_file(source.name, source.endpoint, os.getpid()), workers,
                     elastic=elastic, shard_ring=shard_ring)
    try:
        return sup.run()
    finally:
        for path in (ledger, state.marks_file(source.name, source.endpoint, os.getpid()),
                     *(state.worker_socket(source.name, source.endpoint, os.getpid(), slot)
                       for slot in range(workers))):
            with contextlib.suppress(OSError):
                os.unlink(path)


def _mount_and_serve(args: argparse.Namespace, mnt: str, opts: options.Parsed, cfg: Config, mount: Composed) -> int:
    """Mount ``mount`` (built by ``compose``) and serve it until unmounted or signalled; 1 if the
    mount failed (reported).

    zarr-python (0.15-0.3 s of CPU, more once its files have left the page cache) was imported
    with the layers ``mount`` is built of (``shardfs.tree.commits`` imports ``shardfs.format.v2``),
    before the mount goes live: the first lookup of any node needs it, and a client reading right
    after ``shardfs mount`` returned would wait for it (measured: 0.36 s of a cold ``cat`` of 3072
    chunk files; the mount takes 0.1 s longer)."""
    import pyfuse3
    import trio

    from shardfs.app.status import Status

    source, read_only = mount.source, mount.ops.read_only
    shown = {**opts.own, **{o.partition("=")[0]: o.partition("=")[2] for o in opts.fuse}}
    status = Status(mount.counters(), mnt, source.name, source.endpoint, read_only, shown,
                    state.status_socket(source.name, source.endpoint, os.getpid()),
                    cfg.stats_interval)
    exporter = None
    conn = args.connection
    if cfg.metrics is not None and (conn is None or conn.index == 0):  # (of N workers: slot 0's, summed)
        # bound before the mount goes live: a port in use fails the mount
        exporter = Exporter(parse_address(cfg.metrics), status.snapshot)
        try:
            exporter.start()
        except OSError as e:
            option = f"-o metrics={cfg.metrics}"
            _report(args, f"error: {option}: cannot listen: {e.strerror or e}")
            return 1
    fuse_opts = set(pyfuse3.default_options) | {fsname(source.name), "subtype=shardfs"} | set(opts.fuse)
    if read_only:
        fuse_opts.add("ro")
    if conn is not None:
        conn.connect()  # the supervisor mounts (if nothing is mounted yet) and gives the connection
        try:
            state.private_dir(os.path.dirname(args.ledger))
            mount.ledger.start()
        except (OSError, private.Refused) as e:
            _report(args, f"error: {args.ledger}: cannot create: {getattr(e, 'strerror', None) or e}")
            return 1
        _test_hooks(mount, conn)
    with _stderr_captured() as said:
        try:
            pyfuse3.init(mount.ops, mnt if conn is None else f"/dev/fd/{conn.fd}", fuse_opts)
            if conn is not None:
                takeover: Any = getattr(pyfuse3, "takeover")  # noqa: B009  # (not in stock pyfuse3: supervised())
                conn.initialized(takeover(conn.init))
                if conn.count > 1:  # every worker is woken for each request, one reads it
                    os.set_blocking(conn.fd, False)
        except (RuntimeError, OSError) as e:
            failed: Exception | None = e
        else:
            failed = None
    libfuse = "; ".join(said)
    if failed is not None:
        if exporter is not None:
            exporter.stop()
        _report(args, f"error: {mnt}: cannot mount: {libfuse + f' ({failed})' if libfuse else failed}")
        return 1
    if libfuse and (conn is None or conn.index == 0):  # (the same words from every worker's session)
        log.warning("libfuse: %s", libfuse)
    if conn is None:
        log.info("mounted %s on %s%s", source.name, mnt, " (read-only)" if read_only else "")
    else:
        status.supervised(conn.status_socket, {**conn.status, "worker_pid": os.getpid(),
                                               "worker_started": conn.started, "worker_slot": conn.index,
                                               "worker_count": conn.count})
    _report(args, "ok")
    try:
        trio.run(_serve, mount, status, exporter, conn, getattr(args, "peer_socket", None))
    finally:
        if exporter is not None:
            exporter.stop()
        pyfuse3.close(unmount=conn is None)
        log.info("unmounted %s" if conn is None else "worker %d ends", mnt if conn is None else os.getpid())
        if mount.ranges is not None:
            mount.ranges.flush()  # the disk cache gets the ranges fetched last
    return 0


def _test_hooks(mount: Composed, conn: Any) -> None:
    """For the tests, in the first worker of a mount only: ``SHARDFS_TEST_HANG=NAME`` never
    answers a lookup of NAME (a request read and not answered when the worker is killed);
    ``SHARDFS_TEST_DIE_AFTER=OP:NAME`` kills the worker (SIGKILL) once it did request OP naming
    NAME (``*``: any), before it answers (the kernel sends it again to the next worker);
    ``SHARDFS_TEST_STOP_AFTER=OP:NAME`` stops it (SIGSTOP) there instead, the first time only (a
    request of a live worker in flight when another dies: RESEND sends it again);
    ``SHARDFS_TEST_STALE_OPENS=1``: the file of every open for reading changed during each of
    its tries (``KernelInodes.unwatch``)."""
    hang, die = os.environ.get("SHARDFS_TEST_HANG"), os.environ.get("SHARDFS_TEST_DIE_AFTER")
    stop = os.environ.get("SHARDFS_TEST_STOP_AFTER")
    if conn.init is not None:
        return
    import trio

    if os.environ.get("SHARDFS_TEST_STALE_OPENS"):
        mount.ops._kernel.unwatch = lambda ino, seen: True  # type: ignore[method-assign]  # the test hook replaces it

    if hang:
        lookup = mount.ops.lookup

        async def hanging(parent_inode: int, name: bytes, ctx: Any = None) -> Any:
            if name == os.fsencode(hang):
                await trio.sleep_forever()
            return await lookup(parent_inode, name, ctx)

        mount.ops.lookup = hanging  # type: ignore[method-assign]  # the test hook replaces the handler
    for hook, sig in ((die, signal.SIGKILL), (stop, signal.SIGSTOP)):
        if hook:
            _signalled_after(mount, hook, sig)


def _signalled_after(mount: Composed, hook: str, sig: signal.Signals) -> None:
    """The handler of OP (``hook``: ``OP:NAME``) sends this worker ``sig`` once it did a request
    naming NAME (``*``: any), before it answers; a SIGSTOP only the first time."""
    op, _, name = hook.partition(":")
    handler = getattr(mount.ops, op)
    fired: list[bool] = []

    async def signalled(*args: Any) -> Any:
        result = await handler(*args)
        if (name == "*" or os.fsencode(name) in args) and not (fired and sig == signal.SIGSTOP):
            fired.append(True)
            os.kill(os.getpid(), sig)
        return result

    setattr(mount.ops, op, signalled)


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


async def _serve(mount: Composed, status: Any, exporter: Exporter | None = None, conn: Any = None,
                 peer_socket: str | None = None) -> None:
    """Run the FUSE loop and answer ``shardfs status`` (``status``) and ``-o metrics``
    (``exporter``, which reads the status on this loop); on SIGINT/SIGTERM fold pending writes
    into the shards and end it. A supervisor's worker (``conn``) that replaces a dead one first
    takes over what the dead one gave the kernel (its ledger) and has the kernel
    send again the requests the dead one had read (``fusedev.resend``).

    Pending writes are also folded when the loop ends otherwise (``fusermount3 -u``).
    Changes that cannot be folded stay in the journal (``Writeback.flush`` says why).
    While the mount is live, the kernel's cached attributes of folded chunk files are
    dropped (``Writer.folded``).
    """
    import pyfuse3
    import trio

    from shardfs.app import fusedev, idle
    from shardfs.kernel import fuseloop
    from shardfs.kernel.elastic import Gate
    from shardfs.kernel.forward import PeerServer

    writeback = mount.writeback
    if exporter is not None:
        exporter.serving(trio.lowlevel.current_trio_token())
    # Given to run/flush, not to Writeback(): it is built (and replays the journal) before the tree and Commits.
    folded = mount.commits.folded if mount.commits is not None else None
    flushed = False
    async with trio.open_nursery() as nursery:

        async def on_signal() -> None:
            nonlocal flushed
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) as signals:
                async for sig in signals:  # SIGUSR1: the supervisor hands the mount to a new worker
                    log.info("signal %d: flushing and %s", sig,
                             "handing over" if sig == signal.SIGUSR1 else "unmounting")
                    if writeback is not None:
                        await writeback.flush(folded)
                        flushed = True
                    pyfuse3.terminate()
                    return

        nursery.start_soon(on_signal)
        if conn is not None:
            shared = mount.ledger
            if shared.shared or conn.init is not None:  # what the workers before this one gave out
                await mount.ops.reopen.restore(shared.records())  # (N workers: every one's, so far)
            resent_at = None
            if conn.replaces and conn.resend:
                resent_at = time.monotonic()  # (before: a request begun after it was read after the RESEND)
                fusedev.resend(conn.fd)  # what the dead worker had read comes again
            conn.serving()
            if shared.shared:
                if not os.environ.get("SHARDFS_TEST_NO_FOLLOW"):  # (a test: follow only on a miss, a lock)
                    nursery.start_soon(mount.faults.keep, "ledger", mount.ops.reopen.following,
                                       mount.ops.stats.next_request)
            route = mount.ops.route
            if route is not None and peer_socket is not None:  # N workers (``shardfs.kernel.route``)
                nursery.start_soon(mount.faults.keep, "links", route.peers.run)
                server = PeerServer(peer_socket, mount.ops, state.status_listener, resent_at)
                nursery.start_soon(mount.faults.keep, "peers", server.run)
        # a bug in a background task is logged and the task runs again (``Faults.keep``)
        nursery.start_soon(mount.faults.keep, "status", status.run)
        nursery.start_soon(mount.faults.keep, "idle", idle.trim_when_idle, status.counters, mount.tree.reads)
        if writeback is not None:
            nursery.start_soon(mount.faults.keep, "fold loop", writeback.run, folded)
        gate = None if conn is None or conn.wake is None else Gate(conn.index, conn.wake, mount.ops.stats)
        if gate is not None:
            status.counters.parked = lambda: gate.parked
        # (``SHARDFS_TEST_WAKE_ALL``: the tests' N workers race for every request, ``fuseloop``)
        await fuseloop.main(gate, exclusive=not os.environ.get("SHARDFS_TEST_WAKE_ALL"))
        nursery.cancel_scope.cancel()
    if writeback is not None and not flushed:
        await writeback.flush()  # the kernel connection is gone: no cached attributes to drop


def _report(args: argparse.Namespace, line: str) -> None:
    conn = getattr(args, "connection", None)
    if conn is not None:  # a worker: the supervisor reports
        if line != "ok":
            conn.error(line.removeprefix("error: "))
        return
    if args.ready_fd is None:
        if line != "ok":
            print(f"shardfs: {printable(line)}", file=sys.stderr)
        return
    try:
        os.write(args.ready_fd, (printable(line) + "\n").encode(errors="backslashreplace"))
        os.close(args.ready_fd)
    except OSError:
        pass
