"""The shape of the package, checked from its source: no import cycle between modules, nor
between packages (clusterrun.X, each subpackage one node and each top-level module its own),
small modules, test modules that share helpers only through conftest, and remote/'s floor plan:
the controller enters only its shared/ room, the rooms import downwards, no name repeats the
controller's, no room grows past its size."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "clusterrun"
MAX_LINES = 400

# Modules allowed over MAX_LINES, each with the most lines it may have and why. Lower a ceiling
# (or drop the entry) when a module shrinks; never raise one without a reason here.
LONG_MODULES: dict[str, tuple[int, str]] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports, at module level or inside functions.
    ``from pkg import x`` counts as importing ``pkg.x`` when that is a module, else ``pkg``."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    deps = {m for m in found if m in known and m != name}
    if is_package:  # a package's __init__ importing its own submodules is fine
        deps = {m for m in deps if not m.startswith(f"{name}.")}
    return deps


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, name, known) for name, path in known.items()}


def package(module: str) -> str:
    """``clusterrun.logs.follow`` -> ``clusterrun.logs``; a top-level module (``clusterrun.wire``)
    is a node of its own, as is ``clusterrun`` itself."""
    return ".".join(module.split(".")[:2])


def package_graph(edges: dict[str, set[str]]) -> tuple[dict[str, set[str]],
                                                         dict[tuple[str, str], list[str]]]:
    """The import graph between packages, and for each edge the module imports that make it."""
    out: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for module, deps in sorted(edges.items()):
        source = package(module)
        out.setdefault(source, set())
        for dep in sorted(deps):
            target = package(dep)
            if target != source:
                out[source].add(target)
                why.setdefault((source, target), []).append(f"{module} -> {dep}")
    return out, why


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_module_and_function_level_imports() -> None:
    edges = graph()
    assert "clusterrun.errors" in edges["clusterrun.transport.base"]
    assert "clusterrun.launch.launcher" in edges["clusterrun.cli.launch"]  # inside `launch`
    assert "clusterrun.transport.hostkeys" in edges["clusterrun.transport.ssh"]


def test_no_import_cycle_between_modules() -> None:
    edges = graph()
    found = cycles(edges)
    detail = [" <-> ".join(c) + ": " + "; ".join(
        f"{m} -> {', '.join(sorted(edges[m] & set(c)))}" for m in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(detail)


def test_packages_are_modules_first_two_names() -> None:
    assert package("clusterrun.logs.follow") == "clusterrun.logs"
    assert package("clusterrun.launch.smoke_payload.allreduce") == "clusterrun.launch"
    assert package("clusterrun.wire") == "clusterrun.wire"
    assert package("clusterrun") == "clusterrun"
    edges, why = package_graph({"clusterrun.a.x": {"clusterrun.a.y", "clusterrun.b.z"},
                                "clusterrun.a.y": set(), "clusterrun.b.z": {"clusterrun.c"},
                                "clusterrun.c": {"clusterrun.a.y"}})
    assert edges == {"clusterrun.a": {"clusterrun.b"}, "clusterrun.b": {"clusterrun.c"},
                     "clusterrun.c": {"clusterrun.a"}}
    assert why[("clusterrun.c", "clusterrun.a")] == ["clusterrun.c -> clusterrun.a.y"]
    assert cycles(edges) == [["clusterrun.a", "clusterrun.b", "clusterrun.c"]]


def test_no_import_cycle_between_packages() -> None:
    """Packages stack in layers (inventory -> preflight -> plan -> launch ...; the wire protocol
    below every user of it): a cycle between two packages means neither can be read, tested or
    changed without the other, even when no two modules import each other."""
    edges, why = package_graph(graph())
    found = cycles(edges)
    detail = [" <-> ".join(c) + ":\n    " + "\n    ".join(
        f"{a} -> {b}: " + "; ".join(why[(a, b)]) for a in c for b in sorted(edges[a] & set(c)))
        for c in found]
    assert not found, "import cycles between packages:\n" + "\n".join(detail)


def test_modules_are_small() -> None:
    too_long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        lines = len(path.read_text().splitlines())
        limit = LONG_MODULES.get(rel, (MAX_LINES, ""))[0]
        if lines > limit:
            too_long[rel] = lines
    assert not too_long, f"over {MAX_LINES} lines (or over their allowance): {too_long}"


def test_allowances_are_still_needed() -> None:
    for rel in LONG_MODULES:
        path = REPO / rel
        assert path.exists() and len(path.read_text().splitlines()) > MAX_LINES, (
            f"{rel} is no longer over {MAX_LINES} lines: remove it from LONG_MODULES")


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in conftest.py or a helper module beside it (tests/other_user.py);
    a test module importing another would run (and collect) that module's tests twice and tie
    the two together."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names
                          if n.startswith(("tests.test_", "tests.reliability.test_"))]
    assert not offenders


# remote/: what runs on the hosts, by role (its __init__.py is the map). The controller enters
# only shared/; the rooms import downwards only, so none needs another that needs it back.
REMOTE = PACKAGE / "remote"
ROOM_IMPORTS = {
    "shared": set(),
    "hostlib": {"shared"},
    "probe": {"shared", "hostlib"},
    "node": {"shared", "hostlib", "probe"},
    "tools": {"shared", "hostlib", "probe"},
}
MAX_ROOM_LINES = 2500


def room(module: str) -> str | None:
    """``clusterrun.remote.node.gang`` -> ``node``; None outside remote/'s rooms."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["clusterrun", "remote"] and len(parts) > 2 else None


def test_the_controller_imports_only_the_shared_room() -> None:
    """Everything else in remote/ runs on the hosts alone: the controller importing it would tie
    the two sides together where the wire should be the only tie."""
    found = [f"{module} -> {dep}" for module, deps in sorted(graph().items())
             if not module.startswith("clusterrun.remote") for dep in sorted(deps)
             if dep.startswith("clusterrun.remote") and room(dep) != "shared"]
    assert not found, "the controller imports remote/ outside shared/:\n" + "\n".join(found)


def test_rooms_import_downwards_only() -> None:
    """shared/ imports nothing else from remote/; hostlib/ only shared/; the programs' rooms
    only those below them (ROOM_IMPORTS): no cycle between rooms."""
    assert set(ROOM_IMPORTS) == {p.name for p in REMOTE.iterdir() if p.is_dir()
                                 and p.name != "__pycache__"}
    found = []
    for module, deps in sorted(graph().items()):
        source = room(module)
        if source is None:
            continue
        found += [f"{module} -> {dep}" for dep in sorted(deps)
                  if dep.startswith("clusterrun.remote") and room(dep) != source
                  and room(dep) not in ROOM_IMPORTS[source]]
    assert not found, "a room imports one it may not (ROOM_IMPORTS):\n" + "\n".join(found)
    rooms = {name: set(allowed) for name, allowed in ROOM_IMPORTS.items()}
    assert not cycles(rooms)


def test_the_root_of_remote_holds_only_its_map_and_the_rooms() -> None:
    found = sorted(p.name for p in REMOTE.iterdir()
                   if p.name not in ("__init__.py", "__pycache__") and not p.is_dir())
    assert not found, f"files at the root of remote/ (put them in a room): {found}"
    assert (REMOTE / "__init__.py").read_text().startswith('"""')


def test_no_name_in_remote_repeats_one_of_the_controllers() -> None:
    """A reader (and a traceback) tells the host's module from the controller's by its name
    alone: no module or folder in remote/ is named as one outside it."""
    def names(paths: list[Path]) -> set[str]:
        return {p.stem if p.suffix == ".py" else p.name for p in paths
                if p.name not in ("__init__.py", "__pycache__")}

    controller = names([p for p in PACKAGE.rglob("*") if REMOTE not in p.parents
                        and p != REMOTE and (p.suffix == ".py" or p.is_dir())])
    remote = names([p for p in REMOTE.rglob("*") if p.suffix == ".py" or p.is_dir()])
    both = sorted(remote & controller)
    assert not both, f"named in remote/ and outside it: {both}"


def test_no_room_is_over_its_size() -> None:
    """A room that grows past this wants a new room along a seam, as remote/ itself did."""
    sizes = {folder.name: sum(len(p.read_text().splitlines()) for p in folder.rglob("*.py"))
             for folder in REMOTE.iterdir() if folder.is_dir() and folder.name != "__pycache__"}
    assert not {name: lines for name, lines in sizes.items() if lines > MAX_ROOM_LINES}, sizes


def test_no_call_into_untyped_code_is_ignored() -> None:
    """What the controller calls is typed (remote/shared/ too, in annotations the hosts' Python
    reads; an untyped library through a typed Protocol): mypy checks every call, none is waved
    through with `type: ignore[no-untyped-call]`."""
    found = {str(path.relative_to(REPO)) for path in sorted(PACKAGE.rglob("*.py"))
             if "no-untyped-call" in path.read_text()}
    assert not found, f"no-untyped-call ignored (type the callee instead): {sorted(found)}"


NODESTATE = REMOTE / "shared" / "nodestate.py"


def raw_node_state_reads(source: str, name: str) -> list[tuple[int, str]]:
    """Where a module of remote/ (``name``: its file name) reads the node's state.json around
    remote/shared/nodestate.py: names the file (its text outside layout.py, or layout.STATE),
    reads a Snapshot's ``raw`` by key, or reads a field of the table from a dict called
    ``state`` (``state.get("ended_at")``, ``state["supervisor_pid"]``; the probe's ``state`` of
    open listeners has keys of its own)."""
    from clusterrun.remote.shared import nodestate

    def raw(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "raw"

    def keyed(receiver: ast.expr, key: ast.expr) -> bool:
        named = (isinstance(receiver, ast.Name) and receiver.id == "state") or (
            isinstance(receiver, ast.Attribute) and receiver.attr == "state")
        field = not isinstance(key, ast.Constant) or key.value in nodestate.FIELDS
        return raw(receiver) or (named and field)

    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Constant) and node.value == "state.json" and name != "layout.py":
            found.append((node.lineno, "names state.json"))
        elif (isinstance(node, ast.Attribute) and node.attr == "STATE"
              and isinstance(node.value, ast.Name) and node.value.id == "layout"):
            found.append((node.lineno, "layout.STATE"))
        elif ((isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "get" and node.args
               and keyed(node.func.value, node.args[0]))
              or (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                  and keyed(node.value, node.slice))):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_node_state_is_read_through_its_field_table() -> None:
    """state.json has one writer and one reader (remote/shared/nodestate.py, which names its
    fields and their types): a host program reads a typed Snapshot, never the dict by key."""
    found = [f"{path.relative_to(REPO)}:{line}: {what}"
             for path in sorted(REMOTE.rglob("*.py")) if path != NODESTATE
             for line, what in raw_node_state_reads(path.read_text(), path.name)]
    assert not found, "state.json read around nodestate.py:\n" + "\n".join(found)


def test_the_node_state_rule_sees_raw_reads() -> None:
    source = ('state = read(path)\n'
              'if not state.get("ended_at"):\n    kill(state["supervisor_pid"])\n'
              'snap.raw.get("anything")\n'
              'listener = state.get("sink")\n'
              'open(os.path.join(rundir, "state.json"))\n'
              'layout.STATE\n')
    assert raw_node_state_reads(source, "stop.py") == [
        (2, "state.get('ended_at')"), (3, "state['supervisor_pid']"),
        (4, "snap.raw.get('anything')"), (6, "names state.json"), (7, "layout.STATE")]
