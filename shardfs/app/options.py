"""``-o`` mount options: the ones shardfs takes, the ones it passes to libfuse, the ones it ignores.

Every ``-o`` option is one of:
- shardfs's own (``OWN``), with its value checked here;
- a libfuse 3 option (``FUSE``), passed on: libfuse 3.14 accepts exactly these
  (measured with ``pyfuse3.init``); ``mount.fuse3`` adds ``dev,suid`` (root) or
  ``nosuid,nodev`` (``user``) and ``rw``/``ro`` to what fstab says;
- an fstab/mount(8) option that means nothing to a FUSE daemon (``IGNORED``,
  ``x-*``, ``comment=``, ``helper=``), or a generic mount flag libfuse rejects
  (``relatime``, ``lazytime``, ...) and mount(8) passes on anyway: ignored.
Anything else is an error naming the option: nothing is mounted.

Each of shardfs's own options names the field of the typed ``shardfs.config.Config`` it sets
(``Option.field``), whose default is the option's default (shown by ``--help`` and
``doc/CONFIGURATION.md``); ``config`` builds the ``Config`` of the options given, and
``source`` the ``Source`` it names from the ``storage`` slice (``shardfs.storage.source``
says which kind of source takes which option).
"""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from dataclasses import dataclass, field
from typing import Any, Mapping

from shardfs.app.metrics import parse_address
from shardfs.config import MAX_DEFAULT_WORKERS, Config, parse_size, size_text
from shardfs.storage.source import Source


@dataclass(frozen=True)
class Option:
    name: str
    value: str | None  # the value's placeholder; None for a flag
    help: str
    field: str = ""  # the ``Config`` field it sets ("reads.chunk_cache"; "!tree.ome": a flag that clears it)

    @property
    def default(self) -> str | None:
        """The default as ``-o`` spells it, from ``Config`` (None: a flag, no field, or a default
        the help text says, e.g. a path of the state directory)."""
        if not self.field or self.value is None:
            return None
        value = _get(Config(), self.field)
        if value is None:
            return None
        return size_text(value) if self.value == "SIZE" else f"{value:g}" if isinstance(value, float) else str(value)

    @property
    def described(self) -> str:
        """The help text with the ``Config`` default, as ``--help`` shows it."""
        return f"{self.help} (default {self.default})" if self.default is not None else self.help


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


OWN = (
    Option("ro", None, "read-only: every write fails with EROFS (as --read-only)", "read_only"),
    Option("rw", None, "writable, the default (of ro and rw the last one wins)"),
    Option("nonempty", None, "mount over a non-empty MNT, hiding its files while mounted (without it: refused)",
           "nonempty"),
    Option("entry_timeout", "S", "seconds the kernel caches names", "kernel.entry_timeout"),
    Option("attr_timeout", "S", "seconds the kernel caches attributes", "kernel.attr_timeout"),
    Option("uid", "N", "the owner every node shows (default the mounting user); with allow_other the kernel "
                       "checks it (doc/SECURITY.md)", "kernel.uid"),
    Option("gid", "N", "the group every node shows (default the mounting user's)", "kernel.gid"),
    Option("file_mode", "MODE", "the permission bits every file shows, octal (default 0644; 0444 read-only)",
           "kernel.file_mode"),
    Option("dir_mode", "MODE", "the permission bits every directory shows, octal (default 0755; 0555 read-only)",
           "kernel.dir_mode"),
    Option("chunk_cache", "SIZE", "memory for decoded chunk files, e.g. 256M; 0 = off", "reads.chunk_cache"),
    Option("max_chunk", "SIZE", "largest inner chunk decoded for a chunk file of a transcoded array (a larger "
                                "one is EIO with one log line), and the chunk bytes all decodes hold at once",
           "reads.max_chunk"),
    Option("shard_size", "SIZE", "uncompressed size of a shard of an array created through the mount",
           "writes.shard_size"),
    Option("journal_dir", "DIR", "write journal here (default $XDG_STATE_HOME/shardfs/<id>/journal)",
           "writes.journal_dir"),
    Option("follow_symlinks", None, "read through symlinks that leave SRC (they are never written)",
           "storage.follow_symlinks"),
    Option("endpoint", "URL", "object store: the server (default $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, the AWS "
                              "profile's endpoint_url, else the service's own)", "storage.endpoint"),
    Option("region", "R", "s3://: the bucket's region "
                          "(default $AWS_REGION, $AWS_DEFAULT_REGION, the profile's region)", "storage.region"),
    Option("profile", "NAME", "s3://: the AWS profile of ~/.aws/config and ~/.aws/credentials (default $AWS_PROFILE, "
                              "else default)", "storage.profile"),
    Option("anonymous", None, "object store: unsigned requests (public data, no credentials)", "storage.anonymous"),
    Option("ca_bundle", "FILE", "object store: also trust the CAs in this PEM file (default $AWS_CA_BUNDLE, the "
                                "profile's ca_bundle)", "storage.ca_bundle"),
    Option("insecure", None, "object store: do not verify TLS certificates (a warning at every mount)",
           "storage.insecure"),
    Option("requester_pays", None, "s3://: requests are billed to the requester (requester-pays buckets)",
           "storage.requester_pays"),
    Option("addressing", "STYLE", "s3://: path (https://host/bucket/key) or virtual (https://bucket.host/key) "
                                  "(default the profile's s3 addressing_style, else path with an endpoint)",
           "storage.addressing"),
    Option("cache_size", "SIZE", "object store: memory for fetched object ranges", "reads.cache_size"),
    Option("timeout", "S", "object store: seconds per request; a hung server fails a read after this",
           "storage.timeout"),
    Option("cache_dir", "DIR", "object store: keep fetched ranges here across mounts, keyed by ETag "
                               "(at most 5G, least recently used out first)", "reads.cache_dir"),
    Option("workers", "N", "worker processes serving the mount, each on its own clone of the kernel "
                                "connection; on a writable mount worker 0 owns the writes (doc/ARCHITECTURE.md); "
                                "workers=auto (the default): of a local directory half the cores the daemon may "
                                f"use (its affinity, its cgroup's CPU quota), at most {MAX_DEFAULT_WORKERS}, the "
                                "first serving always and the others "
                                "while requests queue up; of an object store or web URL 1 "
                                "(doc/SEMANTICS.md#workers)", "workers"),
    Option("debug", None, "log every request (as --debug)", "debug"),
    Option("stats_interval", "S", "log a one-line summary of the counters every S seconds (default off; "
                                  "shardfs status shows them)", "stats_interval"),
    Option("metrics", "HOST:PORT", "serve the counters of shardfs status at http://HOST:PORT/metrics in the "
                                   "Prometheus text format (PORT alone: on 127.0.0.1)", "metrics"),
    Option("no_ome_translation", None, "show OME-Zarr 0.5 attributes as stored (as --no-ome-translation)",
           "!tree.ome"),
    Option("c_order", None, "serve arrays stored transposed (shown as \"order\": \"F\") as C-order chunks, "
                            "transcoded: for netCDF-C, NCO and CDO, which ignore \"order\"", "tree.c_order"),
)
_FLAG = "kernel mount flags, passed to libfuse"
FUSE = (
    Option("allow_other", None, "let other users use the mount (non-root: user_allow_other in /etc/fuse.conf)"),
    Option("allow_root", None, "let root use the mount too"),
    Option("default_permissions", None, "the kernel checks the files' mode bits"),
    Option("auto_unmount", None, "unmount when the daemon dies (through fusermount3)"),
    Option("max_read", "N", "largest read request in bytes"),
    *(Option(name, None, _FLAG) for name in
      ("dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "sync", "async", "dirsync")),
)
IGNORED = frozenset({
    "defaults", "_netdev", "nofail", "auto", "noauto", "user", "users", "nouser", "owner", "group",
    "relatime", "norelatime", "nodiratime", "diratime", "strictatime", "nostrictatime", "lazytime",
    "nolazytime", "iversion", "noiversion", "mand", "nomand", "symfollow", "nosymfollow", "silent", "loud",
})
IGNORED_PREFIXES = ("x-", "X-", "comment=", "helper=")
_BY_NAME = {o.name: o for o in OWN + FUSE}
MAX_WORKERS = 64


@dataclass
class Parsed:
    own: dict[str, str] = field(default_factory=dict)  # name -> value ("" for a flag)
    fuse: list[str] = field(default_factory=list)  # passed to libfuse as given
    ignored: list[str] = field(default_factory=list)

    @property
    def read_only(self) -> bool:
        return "ro" in self.own


def parse(groups: list[str]) -> Parsed:
    """Sort the values of every ``-o`` (comma-separated lists); ``ValueError`` names a bad one."""
    out = Parsed()
    for group in groups:
        for opt in filter(None, group.split(",")):
            name, eq, value = opt.partition("=")
            if name in IGNORED or opt.startswith(IGNORED_PREFIXES):
                out.ignored.append(opt)
                continue
            spec = _BY_NAME.get(name)
            if spec is None:
                raise ValueError(f"-o {opt}: unknown option (shardfs --help lists them)")
            if spec.value is None and eq:
                raise ValueError(f"-o {opt}: {name} takes no value")
            if spec.value is not None and not value:
                raise ValueError(f"-o {opt}: {name} needs a value ({name}={spec.value})")
            if spec in FUSE:
                out.fuse.append(opt)
            elif name in ("ro", "rw"):
                out.own.pop("rw" if name == "ro" else "ro", None)
                out.own[name] = ""
            else:
                out.own[name] = value
    _check_values(out.own)
    return out


def _check_values(own: dict[str, str]) -> None:
    for name in ("entry_timeout", "attr_timeout", "timeout", "stats_interval"):
        if name in own:
            positive = name in ("timeout", "stats_interval")
            try:
                seconds = float(own[name])
                ok = seconds > 0 if positive else seconds >= 0
            except ValueError:
                ok = False
            if not ok or not math.isfinite(seconds):
                raise ValueError(f"-o {name}={own[name]}: not a " + ("positive " if positive else "")
                                 + "number of seconds")
    if "workers" in own and own["workers"] != "auto" and not (
            own["workers"].isdigit() and 1 <= int(own["workers"]) <= MAX_WORKERS):
        raise ValueError(f"-o workers={own['workers']}: not auto nor a number of workers from 1 to {MAX_WORKERS}")
    if "metrics" in own:
        parse_address(own["metrics"])
    if own.get("addressing", "path") not in ("path", "virtual"):
        raise ValueError(f"-o addressing={own['addressing']}: not path or virtual")
    endpoint = own.get("endpoint")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"-o endpoint={endpoint}: not an http:// or https:// URL")
    for name in ("uid", "gid"):
        if name in own and not (own[name].isdigit() and int(own[name]) < 2**32 - 1):
            raise ValueError(f"-o {name}={own[name]}: not a number of a user or group")
    for name in ("file_mode", "dir_mode"):
        if name in own and not (own[name] and set(own[name]) <= set("01234567") and int(own[name], 8) <= 0o777):
            raise ValueError(f"-o {name}={own[name]}: not octal permission bits (e.g. 0640)")
    for name in ("chunk_cache", "shard_size", "cache_size", "max_chunk"):
        if name in own:
            try:
                parse_size(own[name])
            except ValueError:
                raise ValueError(f"-o {name}={own[name]}: not a size (e.g. 64M)") from None


def config(parsed: Parsed) -> Config:
    """The ``Config`` the ``-o`` options of ``parsed`` (checked by ``parse``) give: each sets its
    ``Option.field`` (seconds as a number, sizes in bytes, a flag True, ``!`` a flag False),
    every other field keeps its default."""
    values: dict[str, Any] = {}
    for name, text in parsed.own.items():
        opt = _BY_NAME[name]
        if not opt.field:
            continue
        value: Any = True if opt.value is None else text
        if opt.value == "S":
            value = float(text)
        elif opt.value == "N":
            value = None if text == "auto" else int(text)  # (``parse`` lets auto through for workers alone)
        elif opt.value == "MODE":
            value = int(text, 8)
        elif opt.value == "SIZE":
            value = parse_size(text)
        values[opt.field.lstrip("!")] = not value if opt.field.startswith("!") else value
    if "writes.shard_size" in values:
        values["writes.shard_size"] = max(1, values["writes.shard_size"])
    return _with(Config(), values)


def source(src: str, parsed: Parsed, environ: Mapping[str, str] = os.environ, resolved: str | None = None) -> Source:
    """The ``Source`` that ``src`` names, with the ``storage`` slice of ``config(parsed)`` (and
    the settings ``resolved`` says were found for it: ``Source.parse``); ``ValueError`` (one
    line) for an option given that this kind of source does not take."""
    return Source.parse(src, config(parsed).storage, parsed.own.keys(), environ, resolved)


def _with(obj: Any, values: dict[str, Any]) -> Any:
    """``obj`` (a frozen dataclass) with the dotted fields of ``values`` replaced."""
    own = {k: v for k, v in values.items() if "." not in k}
    for part in {k.partition(".")[0] for k in values if "." in k}:
        inner = {k.partition(".")[2]: v for k, v in values.items() if k.startswith(part + ".")}
        own[part] = _with(getattr(obj, part), inner)
    return dataclasses.replace(obj, **own)


def help_text() -> str:
    """The ``-o`` options for ``--help``: one line each."""
    def line(name: str, text: str) -> str:
        return f"  {name:22} {text}"

    flags = ",".join(o.name for o in FUSE if o.help == _FLAG)
    ignored = ", ".join(sorted(IGNORED)) + ", x-*, comment=*, helper=*"
    return "\n".join(
        ["mount options (-o OPT[,OPT...]):"]
        + [line(f"{o.name}={o.value}" if o.value else o.name, o.described) for o in OWN + FUSE if o.help != _FLAG]
        + ["  " + flags, line("", _FLAG + " (mount.fuse3 adds dev,suid as root)"),
           "ignored (fstab and mount(8) options that mean nothing to shardfs):"]
        + textwrap.wrap(ignored, 78, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False))
