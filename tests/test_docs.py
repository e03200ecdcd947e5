"""The documentation is kept honest: README.md, doc/*.md and tests/README.md.

- README.md has at most 150 lines and starts with the two set-up commands;
- doc/CONFIGURATION.md's option tables are what ``scripts/gen-config-doc`` writes from the
  option table in ``shardfs/app/options.py``, and name every ``-o`` option;
- every message the command line prints (the literal text of each ``UsageError``, of the
  ``ValueError`` an option or URL check raises, of the mount-time object-store check, of
  what ``shardfs umount`` prints) is in doc/TROUBLESHOOTING.md;
- every relative link resolves, anchors included (``<a id>`` or a heading's GitHub slug);
- every ```` ```sh ```` block in README.md and doc/ runs and exits 0 against the example
  source of the README (``shards/`` with the array ``raw``), with ``/mnt/view`` replaced by
  a temporary mountpoint, unless the line before it says
  ``<!-- docs-test: skip (REASON) -->``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, is_mounted, lazy_unmount

DOCS = [REPO / "README.md", *sorted((REPO / "doc").glob("*.md")), REPO / "tests" / "README.md"]
TROUBLESHOOTING = REPO / "doc" / "TROUBLESHOOTING.md"
CONFIGURATION = REPO / "doc" / "CONFIGURATION.md"
SKIP = re.compile(r"<!-- docs-test: skip \((?P<reason>[^)]+(?:\([^)]*\)[^)]*)*)\) -->")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)


# ------------------------------------------------------------------ README


def test_readme_is_short_and_starts_with_the_two_setup_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    code = [line.strip() for line in lines if line.startswith("    ") and line.strip()]
    assert code[:2] == ["./scripts/install && ./scripts/demo", "./scripts/install && ./scripts/test"]
    assert lines.index("    " + code[1]) < 15


# ------------------------------------------------------------------ CONFIGURATION


def test_configuration_page_is_what_the_generator_writes():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-config-doc"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_every_option_is_in_the_configuration_tables():
    from shardfs.app import options

    rows = re.findall(r"^\| `([a-z_]+)(?:=[A-Z:]+)?` \|", CONFIGURATION.read_text(), re.M)
    assert sorted(rows) == sorted(o.name for o in options.OWN + options.FUSE)
    text = CONFIGURATION.read_text()
    for name in sorted(options.IGNORED) + [p + "*" for p in options.IGNORED_PREFIXES]:
        assert f"`{name}`" in text, name


# ------------------------------------------------------------------ TROUBLESHOOTING

# (module, calls whose literal text is a message the command line prints, functions all of
# whose string literals are such messages)
MESSAGE_SOURCES = [
    ("app/cli.py", {"UsageError", "print"}, set()),
    ("app/run.py", {"UsageError", "_report"}, set()),
    ("app/replay.py", {"UsageError"}, set()),
    ("app/options.py", {"ValueError"}, set()),
    ("storage/source.py", {"ValueError"}, set()),
    ("storage/urls.py", {"ValueError"}, set()),
    ("reads/rangecache.py", {"ValueError"}, set()),
    ("app/report.py", {"ValueError"}, set()),
    ("app/status_client.py", {"StatusError"}, set()),
    ("writes/journal.py", set(), {"kept_line"}),
    ("storage/objects.py", {"ValueError", "StorageUnavailable"}, {"check"}),
    ("storage/aws.py", {"AwsConfigError"}, set()),
    ("storage/awscredentials.py", {"AwsConfigError"}, {"_why", "_nothing_found"}),
    ("storage/cloudcredentials.py", {"CloudConfigError"}, set()),
    ("app/status_client.py", {"StatusError"}, set()),
    ("format/gridmap.py", {"ValueError"}, set()),
    ("app/survey.py", {"ValueError"}, set()),
    ("app/metrics.py", {"ValueError"}, set()),
]


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _literals(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def cli_messages() -> dict[str, str]:
    """Each literal fragment (of 10 characters or more) of the messages above -> where it is."""
    found: dict[str, str] = {}
    for module, calls, functions in MESSAGE_SOURCES:
        tree = ast.parse((REPO / "shardfs" / module).read_text())
        for node in ast.walk(tree):
            texts: list[str] = []
            if isinstance(node, ast.Call) and _call_name(node) in calls and node.args:
                if _call_name(node) == "print" and not any(
                        k.arg == "file" and ast.unparse(k.value) == "sys.stderr" for k in node.keywords):
                    continue
                texts = _literals(node.args[-1] if _call_name(node) == "_report" else node.args[0])
            elif isinstance(node, ast.FunctionDef) and node.name in functions:
                body = node.body[1:] if ast.get_docstring(node) else node.body
                texts = [t for stmt in body for t in _literals(stmt)]
            for text in texts:
                fragment = re.sub(r"^shardfs: (error: )?", "", text.strip()).lstrip(":").strip()
                if len(fragment) >= 10 and not fragment.startswith("%"):
                    found.setdefault(fragment, f"shardfs/{module}:{getattr(node, 'lineno', '?')}")
    return found


def test_every_command_line_message_is_in_troubleshooting():
    messages = cli_messages()
    assert len(messages) >= 40  # the extraction still finds them
    page = TROUBLESHOOTING.read_text()
    missing = [f"{where}: {text!r}" for text, where in sorted(messages.items()) if text not in page]
    assert missing == [], "add these messages (cause and fix) to doc/TROUBLESHOOTING.md:\n" + "\n".join(missing)


# ------------------------------------------------------------------ links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return ({slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
            | set(re.findall(r'<a id="([^"]+)"></a>', text)))


def test_every_relative_link_and_anchor_resolves():
    bad = []
    for doc in DOCS:
        text = FENCE.sub("", doc.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                bad.append(f"{doc.relative_to(REPO)}: {target}: no such file")
            elif anchor and (path.suffix != ".md" or anchor not in anchors(path)):
                bad.append(f"{doc.relative_to(REPO)}: {target}: no such anchor")
    assert bad == []


def test_semantics_anchors_named_in_tests_readme_exist():
    named = set(re.findall(r"SEMANTICS\.md#([\w-]+)", (REPO / "tests" / "README.md").read_text()))
    assert {"shows", "writes", "journal", "folds", "limits", "hostile-sources", "consistency"} <= named
    assert named <= anchors(REPO / "doc" / "SEMANTICS.md")


# ------------------------------------------------------------------ commands


def sh_blocks() -> list[tuple[str, str, str | None]]:
    """(where, block, skip reason or None) of every ```sh block in README.md and doc/."""
    out = []
    for doc in DOCS[:-1]:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) != "sh":
                continue
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            skip = SKIP.fullmatch(before.strip())
            line = text[:m.start()].count("\n") + 1
            out.append((f"{doc.relative_to(REPO)}:{line}", m.group(2), skip.group("reason") if skip else None))
    return out


BLOCKS = sh_blocks()


def test_every_skipped_block_says_why_and_most_blocks_run():
    assert all(reason is None or len(reason) > 10 for _, _, reason in BLOCKS)
    ran = [where for where, _, reason in BLOCKS if reason is None]
    assert any(where.startswith("README.md") for where in ran)
    assert len(ran) >= 3


def installed_commands(root: Path) -> Path:
    """A directory holding what ``scripts/install`` links into /usr/local/bin, pointing into
    this checkout (``shardfs-example``, ``shardfs-zarr2-python``): put first on PATH."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "shardfs-example").symlink_to(REPO / "scripts" / "example")
    (bin_dir / "shardfs-zarr2-python").symlink_to(REPO / "scripts" / "zarr2-python")
    return bin_dir


@pytest.mark.parametrize("where,block", [(w, b) for w, b, reason in BLOCKS if reason is None],
                         ids=[w for w, _, reason in BLOCKS if reason is None])
def test_shell_block_runs(where, block, tmp_path):
    """Each block runs in an empty directory, as a newcomer would run it: the README's
    Quickstart makes its own example (``shardfs-example``); the other pages' blocks find it in
    ``shards/`` (made by the same script)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    commands = installed_commands(tmp_path)
    env = dict(os.environ, PATH=os.pathsep.join([str(commands), str(Path(sys.executable).parent), os.environ["PATH"]]))
    if "shardfs-example" not in block:
        subprocess.run([str(commands / "shardfs-example"), "shards"], cwd=cwd, env=env, check=True,
                       capture_output=True, timeout=120)
    mnt = tmp_path / "view"
    script = block.replace("/mnt/view", str(mnt))
    try:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                           capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        mounted_after = is_mounted(mnt)
    finally:
        lazy_unmount(mnt)
    assert r.returncode == 0, f"{where}:\n{script}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert not mounted_after, f"{where} leaves {mnt} mounted"
    if "zarr.open('/mnt/view/raw')[0, 0, :4]" in block:
        assert "[0 1 2 3]" in r.stdout
    if "touch /mnt/view/raw/x || echo refused" in block:
        assert r.stdout == "refused\n" and "Read-only file system" in r.stderr
    if "cp -r /mnt/view/raw raw-v2" in block:
        assert r.stdout.split() == ["0.0.0", "0.0.1", "0.0.2"]
    if "shardfs --version" in block:
        assert re.search(r"^shardfs \d+\.\d+", r.stdout, re.M)
    if "shardfs --help" in block:
        from shardfs.app import options

        assert all(o.name in r.stdout for o in options.OWN)
