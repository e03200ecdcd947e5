"""The package's layering (doc/ARCHITECTURE.md): data flows down only, no import cycles.

Every module's imports are read with ``ast``, including function-level imports and those under
``if TYPE_CHECKING:``, so a cycle cannot hide behind a lazy import. A room may import its own
modules and the rooms below it, never one above; the module graph has no cycle; a name starting
with ``_`` is imported only inside its own room. No mount: this runs in milliseconds.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "shardfs"
# Top to bottom; a room imports only itself and rooms after it.
ROOMS = ["app", "kernel", "tree", "reads", "writes", "shards", "storage", "format", "base"]
# Below every room: __version__ and the typed configuration (imported by all); above: the entry point.
TOP = {"shardfs": len(ROOMS), "shardfs.config": len(ROOMS), "shardfs.__main__": -1}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules()


def imports(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports anywhere in its text (also inside functions and
    ``if TYPE_CHECKING:``), with the package ``__init__`` an import from outside it runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in targets:
            if target.split(".")[0] != "shardfs":
                continue
            while target not in MODULES:  # an attribute of a module: the module
                target = target.rpartition(".")[0]
            found.add(target)
            parent = target.rpartition(".")[0]
            if parent and parent != "shardfs" and not name.startswith(parent):
                found.add(parent)  # importing shardfs.x.y runs shardfs/x/__init__.py first
    found.discard(name)
    return found


GRAPH = {name: imports(name, path) for name, path in MODULES.items()}


def room(name: str) -> int:
    """The rank of ``name``'s room: 0 the top (``app``)."""
    if name in TOP:
        return TOP[name]
    return ROOMS.index(name.split(".")[1])


def test_every_module_is_in_a_room():
    loose = [n for n in MODULES if n not in TOP and (n.count(".") < 1 or n.split(".")[1] not in ROOMS)]
    assert loose == []
    assert sorted({n.split(".")[1] for n in MODULES if n not in TOP}) == sorted(ROOMS)


def test_no_upward_import():
    upward = sorted(f"{name} -> {dep}" for name, deps in GRAPH.items() for dep in deps if room(dep) < room(name))
    assert upward == []


def test_no_import_cycle():
    """Depth-first search for a back edge; the first cycle found is shown whole."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for dep in sorted(GRAPH[name]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[name] = 2
        return None

    cycles = [c for name in sorted(GRAPH) if name not in state and (c := visit(name))]
    assert cycles == []


def test_no_room_imports_another_rooms_private_names():
    """``from shardfs.<room>... import _name`` only inside that room: what crosses rooms is public."""
    private = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardfs.") and not node.level:
                theirs = node.module.split(".")[1] if node.module.count(".") else ""
                mine = name.split(".")[1] if name not in TOP else ""
                private += [f"{name} imports {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and theirs != mine]
    assert private == []


@pytest.mark.parametrize("name", ROOMS)
def test_every_room_names_its_public_face(name):
    """Each room's ``__init__`` states its job and lists its public names in ``__all__``,
    each a module of the room or a name the ``__init__`` defines or imports."""
    init = PACKAGE / name / "__init__.py"
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree)
    public = [node for node in tree.body if isinstance(node, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)]
    assert len(public) == 1
    names = ast.literal_eval(public[0].value)
    defined = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
               if isinstance(t, ast.Name)}
    defined |= {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    defined |= {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom) for a in node.names}
    missing = [n for n in names if n not in defined and not (PACKAGE / name / f"{n}.py").exists()]
    assert names and missing == []


def public_face(package: Path, name: str) -> set[str]:
    """Room ``name``'s ``__all__``."""
    tree = ast.parse((package / name / "__init__.py").read_text())
    return {n for node in tree.body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            for n in ast.literal_eval(node.value)}


def test_what_one_room_imports_from_another_is_in_that_rooms_public_face():
    """A module (``from shardfs.kernel.route import Route``: ``route``) or a name of its
    ``__init__`` (``from shardfs.reads import ReadHandle``) that one room imports from another
    is in that room's ``__all__``: the public face an ``__init__`` names is what crosses rooms.
    Read in the package imported (``scripts/mutants``' copy)."""
    import shardfs

    package = Path(shardfs.__file__).parent
    faces = {name: public_face(package, name) for name in ROOMS}
    outside = []
    for path in sorted(package.glob("*/*.py")):
        mine = path.parent.name
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardfs.")) or node.level:
                continue
            parts = node.module.split(".")
            theirs = parts[1]
            if theirs == mine or theirs not in faces:
                continue
            used = [parts[2]] if len(parts) > 2 else [a.name for a in node.names]
            outside += [f"{mine}/{path.stem} imports {theirs}.{u}" for u in used if u not in faces[theirs]]
    assert sorted(set(outside)) == [], "name these in the room's __init__ (__all__), with their job"


def test_the_architecture_page_names_every_module_of_each_room():
    """doc/ARCHITECTURE.md's package map has a row per room, listing each of its modules."""
    page = (PACKAGE.parent / "doc" / "ARCHITECTURE.md").read_text()
    row = re.compile(r"^\| `(\w+)/` \|.*\| (.*) \| \d+ \|$", re.M)
    rows = {m[1]: set(re.findall(r"`(\w+)`", m[2])) for m in row.finditer(page)}
    assert sorted(rows) == sorted(ROOMS)
    unlisted = sorted(f"{room}/{p.stem}" for room in ROOMS for p in (PACKAGE / room).glob("*.py")
                      if p.stem != "__init__" and p.stem not in rows[room])
    assert unlisted == [], "name these modules (and their job) in doc/ARCHITECTURE.md's package map"


HEAVY = ("trio", "pyfuse3", "numpy", "zarr", "obstore", "botocore")  # what a supervisor needs none of


def _fresh(probe: str, env: dict[str, str] | None = None) -> str:
    """What a fresh interpreter running ``probe`` prints (the package under test: a mutant's copy too)."""
    import shardfs

    here = str(Path(shardfs.__file__).parent.parent)
    out = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True,
                         env={**(env or os.environ), "PYTHONPATH": here})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_supervisor_imports_none_of_the_workers_libraries():
    """The process ``shardfs mount`` leaves to hold the mount (``shardfs.app.supervisor``, after
    ``shardfs.app.cli``) imports no trio, pyfuse3, numpy, zarr, obstore or botocore: it stays
    small (doc/BENCHMARKING.md, "The memory of a supervised mount")."""
    probe = f"import sys, shardfs.app.cli, shardfs.app.supervisor; print([m for m in {HEAVY!r} if m in sys.modules])"
    assert _fresh(probe) == "[]"


def test_the_supervisor_of_an_s3_mount_is_given_its_settings(tmp_path):
    """``shardfs mount s3://...`` finds the AWS settings and gives its daemon them on its command
    line (``--resolved``): the daemon, parsing that command line before it supervises, imports
    no botocore and has the same source, even where the AWS configuration is gone."""
    import argparse

    from shardfs.app import options, run

    config = tmp_path / "config"
    config.write_text("[profile lab]\nregion = eu-west-3\nendpoint_url = http://127.0.0.1:9\n"
                      "s3 =\n    addressing_style = virtual\n")
    aws = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    found = options.source("s3://b/p", options.parse(["profile=lab"]), {**aws, "AWS_CONFIG_FILE": str(config)})
    assert (found.endpoint, found.config.region, found.config.addressing) == ("http://127.0.0.1:9", "eu-west-3",
                                                                             "virtual")
    args = argparse.Namespace(mnt=str(tmp_path / "mnt"), options=["profile=lab"], read_only=False, debug=False,
                              ome=True, log_file=None)
    argv = run._daemon_argv(args, found)
    probe = ("import sys\nfrom shardfs.app import cli, options, supervisor\n"
             f"args = cli._parser().parse_args({argv[argv.index('mount'):]!r})\n"
             "source = options.source(args.src, options.parse(args.options), resolved=args.resolved)\n"
             f"print([m for m in {HEAVY!r} if m in sys.modules], source.name, source.config)")
    assert _fresh(probe, aws) == f"[] {found.name} {found.config}"


def test_the_layer_check_sees_lazy_and_type_checking_imports(tmp_path):
    """The parser counts an import inside a function and one under ``TYPE_CHECKING``."""
    lazy = [n for n, p in MODULES.items() if re.search(r"^    +from shardfs\.", p.read_text(), re.M)]
    assert lazy, "no function-level import left to check the parser on"
    text = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from shardfs.tree.names import Names\n" \
           "def f():\n    from shardfs.app import cli\n"
    probe = tmp_path / "probe.py"
    probe.write_text(text)
    assert imports("shardfs.format.probe", probe) == {"shardfs.tree.names", "shardfs.tree", "shardfs.app.cli",
                                                      "shardfs.app"}


# What a constructor may take from a collaborator it is given, and why. Anything else it reads
# off one (``writer.structure``, ``numbers.ledger``) is a reach-through: ``compose`` hands each
# object the collaborators it uses (doc/ARCHITECTURE.md, "Who builds what").
TAKEN = {
    # bound methods kept to call: the collaborator's own job, asked of it
    "Operations": {"invalidation.invalidate", "nodes.new_alias"},
    "Structure": {"commits.invalidate"},
    "Writer": {"commits.invalidate"},
    "Reopen": {"ledger.followers"},  # it registers its follower with the ledger
    # the hierarchy's table of arrays (and the mount's time), read at every lookup and listing
    "Names": {"hierarchy.arrays", "hierarchy.mount_ns"},
    "Listing": {"names.arrays"},
    # the read half of ``Storage`` forwarded to the request path it is given (storage/requests.py)
    "OverRequests": {"requests.url", "requests.scheme", "requests.loop", "requests.stats"},
}


def reach_throughs(package: Path) -> dict[str, set[str]]:
    """Per class of ``package``: ``param.attr`` its ``__init__`` reads off a parameter whose
    annotation names a class of the package (not a configuration: ``*Config``, ``Access``),
    other than to call it at once."""
    classes = {n.name for p in package.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.ClassDef)}
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(cls, ast.ClassDef):
                continue
            for fn in cls.body:
                if not (isinstance(fn, ast.FunctionDef) and fn.name == "__init__"):
                    continue
                params = set()
                for a in fn.args.args + fn.args.kwonlyargs:
                    named = {x.id for x in ast.walk(a.annotation) if isinstance(x, ast.Name)} if a.annotation else set()
                    named |= set(re.findall(r"\w+", a.annotation.value)) if isinstance(a.annotation, ast.Constant) \
                        and isinstance(a.annotation.value, str) else set()
                    if any(n in classes and not n.endswith("Config") and n != "Access" for n in named):
                        params.add(a.arg)
                called = {id(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
                for n in ast.walk(fn):
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in params \
                            and isinstance(n.ctx, ast.Load) and id(n) not in called:
                        found.setdefault(cls.name, set()).add(f"{n.value.id}.{n.attr}")
    return found


def test_no_constructor_reaches_through_a_collaborator():
    """No object takes a part of another it is given (``self.structure = writer.structure``):
    ``compose`` hands it that part itself. Read in the package imported (``scripts/mutants``' copy)."""
    import shardfs

    found = reach_throughs(Path(shardfs.__file__).parent)
    extra = {cls: sorted(got - TAKEN.get(cls, set())) for cls, got in found.items() if got - TAKEN.get(cls, set())}
    assert extra == {}, "have compose hand these objects what they read off their collaborators"
    assert found.get("Operations") == TAKEN["Operations"], "the check no longer sees the adapter's constructor"


def test_the_bench_figures_import_no_other_figure():
    """``scripts/bench_lib``: a figure imports ``harness`` and ``readers`` (and ``main`` the figures
    it runs), never another figure's module (doc/ARCHITECTURE.md, "Tests and tools"); and neither
    tools package imports ``tests``."""
    scripts = PACKAGE.parent / "scripts"
    shared = {"harness", "readers", "report", "clients", "floorfs"}
    wrong = []
    for path in sorted((scripts / "bench_lib").glob("*.py")):
        if path.stem in ("main", "__main__", "__init__"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                used = {n.split(".")[1] for n in names if n.startswith("bench_lib.")}
                used |= {a.name for a in node.names} if node.module == "bench_lib" else set()
                wrong += [f"{path.stem} imports {u}" for u in sorted(used - shared - {path.stem})
                          if (scripts / "bench_lib" / f"{u}.py").exists()]
    for path in sorted(scripts.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            wrong += [f"{path.relative_to(scripts)} imports {m}" for m in mods
                      if m.split(".")[0] in ("tests", "conftest")]
    assert wrong == []
