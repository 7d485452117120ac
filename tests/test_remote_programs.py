"""The programs clusterrun ships to hosts run on the host's own Python, which may be as old as
3.6, with nothing but the standard library: checked here, as shipped."""

from __future__ import annotations

import ast
import base64
import importlib.util
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import clusterrun
from clusterrun.transport import bundle, shell

REMOTE = Path(clusterrun.__file__).parent / "remote"
FILES = sorted(str(p.relative_to(REMOTE)) for p in REMOTE.rglob("*.py"))
PROGRAMS = ["run.py", "command.py", "tail.py", "status.py", "stop.py", "probe.py", "files.py"]


@pytest.mark.parametrize("name", FILES)
def test_every_remote_file_parses_with_the_python_3_6_grammar(name: str) -> None:
    tree = ast.parse((REMOTE / name).read_text(), name, feature_version=(3, 6))
    # Beyond the grammar: nothing newer than 3.6 that parses anyway.
    for node in ast.walk(tree):
        assert not isinstance(node, ast.JoinedStr), f"{name}:{node.lineno}: an f-string"
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            assert not any(a.name == "annotations" for a in node.names), name


@pytest.mark.parametrize("name", FILES)
def test_remote_files_import_only_the_standard_library(name: str) -> None:
    tree = ast.parse((REMOTE / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith(
                "clusterrun.remote."):
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            assert module.split(".")[0] in sys.stdlib_module_names, f"{name}: {module}"


@pytest.mark.parametrize("name", PROGRAMS)
def test_every_program_as_shipped_parses_with_the_python_3_6_grammar(name: str) -> None:
    """The loader and the shared modules it carries included."""
    source = bundle.program_source(name)
    ast.parse(source, name, feature_version=(3, 6))
    # The shipped shared modules too (packed string literals inside the loader's calls).
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                "_clusterrun_module", "_clusterrun_code") and len(node.args) >= 2:
            packed = node.args[1 if node.func.id == "_clusterrun_module" else 0]  # type: ignore[attr-defined]
            if isinstance(packed, ast.Constant) and isinstance(packed.value, str):
                text = zlib.decompress(base64.b64decode(packed.value))
                ast.parse(text, name, feature_version=(3, 6))


def test_a_program_arrives_with_the_shared_modules_it_imports() -> None:
    source = bundle.program_source("run.py")
    assert b'"clusterrun.remote.hostlib.hostio"' in source
    assert b'"clusterrun.remote.node.gang"' in source
    assert source.index(b'"clusterrun.remote.hostlib.hostio"') < source.index(
        b"<clusterrun run.py>")
    # Each room a package before any of its modules.
    assert source.index(b'_clusterrun_module("clusterrun.remote.node", None)') < source.index(
        b'"clusterrun.remote.node.gang"')
    probe = bundle.program_source("probe.py")
    for module in ("nvidia", "meshtest", "sysinfo", "throughput"):
        assert b'"clusterrun.remote.probe.%s"' % module.encode() in probe
    # The copy's program words a path it cannot write as facts (remote/probe/pathcheck.py).
    assert b'"clusterrun.remote.probe.pathcheck"' in bundle.program_source("files.py")


def test_the_shipped_program_runs_from_a_directory_without_clusterrun(tmp_path: Path) -> None:
    """Through the constant bootstrap command line, as sshd runs it, from an empty directory
    and with -I (no site-packages, no PYTHONPATH): only what arrived on stdin is used."""
    request = {"rundir": str(tmp_path / "nothing-here")}
    proc = subprocess.run([sys.executable, "-I", "-u", "-c", shell.BOOTSTRAP],
                          input=shell.program_input("status.py", request), capture_output=True,
                          cwd=tmp_path, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout[2:]) == {"ev": "status", "state": None}


def test_an_interpreter_of_another_bytecode_format_compiles_the_shipped_source(
        tmp_path: Path) -> None:
    """A host whose Python differs from this one's in minor version cannot load the compiled
    modules: it unpacks their source and compiles it."""
    request = {"rundir": str(tmp_path / "nothing-here")}
    magic = repr(importlib.util.MAGIC_NUMBER).encode()
    other = repr(bytes([importlib.util.MAGIC_NUMBER[0] ^ 1]) + importlib.util.MAGIC_NUMBER[1:])
    program = shell.program_input("status.py", request)
    modules = bundle._shared_modules(bundle._remote_source("tools/status.py"))
    assert program.count(magic) == len(modules) + 1 and len(other) == len(magic)
    proc = subprocess.run([sys.executable, "-I", "-u", "-c", shell.BOOTSTRAP],
                          input=program.replace(magic, other.encode()), capture_output=True,
                          cwd=tmp_path, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout[2:]) == {"ev": "status", "state": None}


def test_what_a_program_imports_is_read_from_its_code_not_its_layout() -> None:
    """Every form of import the interpreter follows is shipped: a room's modules on one line or
    in parentheses over several (as ruff's isort writes a long one), a module's names, a plain
    import, and one inside a function; other packages and a comment are not."""
    import ast

    source = (b"import os\n"
              b"from clusterrun.remote.shared import layout, protocol\n"
              b"from clusterrun.remote.hostlib import (\n    hostio,\n    procs,\n)\n"
              b"from clusterrun.remote.hostlib.hostio import Cause\n"
              b"import clusterrun.remote.probe.nvidia\n"
              b"# from clusterrun.remote.tools import stop\n"
              b"def later():\n    from clusterrun.remote.node import gang\n")
    assert bundle._imported(ast.parse(source)) == [
        "shared/layout.py", "shared/protocol.py", "hostlib/hostio.py", "hostlib/procs.py",
        "hostlib/hostio.py", "probe/nvidia.py", "node/gang.py"]


def test_programs_are_named_by_their_file_name_once_across_the_rooms() -> None:
    names = bundle.program_names()
    assert len(names) == len(set(names))
    assert {"run.py", "probe.py", "files.py", "status.py", "pyenv.py"} <= set(names)


def test_a_built_program_is_kept_and_rebuilt_when_its_sources_change(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command reads the program another command built from the same sources instead of
    compiling them again; a changed shared module builds anew and the old copy goes."""
    monkeypatch.setattr(bundle, "_built", {})
    first = bundle.program_source("run.py")
    kept = list((home / "cache" / "programs").glob("run-*.py"))
    assert len(kept) == 1 and kept[0].read_bytes() == first
    loader = len(bundle._LOADER)
    marked = first[:loader] + b"# read from the cache\n" + first[loader:]
    kept[0].write_bytes(marked)
    monkeypatch.setattr(bundle, "_built", {})
    assert bundle.program_source("run.py") == marked
    kept[0].write_bytes(first[:-100])  # cut short: built again, not shipped
    monkeypatch.setattr(bundle, "_built", {})
    assert bundle.program_source("run.py") == first == kept[0].read_bytes()

    original = bundle._remote_source
    monkeypatch.setattr(bundle, "_remote_source", lambda name: original(name) + (
        b"# changed\n" if name == "hostlib/procs.py" else b""))
    monkeypatch.setattr(bundle, "_built", {})
    changed = bundle.program_source("run.py")
    assert changed != first
    assert [p.read_bytes() for p in (home / "cache" / "programs").glob("run-*.py")] == [changed]


def test_a_home_that_cannot_be_written_still_gets_the_program(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("CLUSTERRUN_HOME", str(blocked))
    monkeypatch.setattr(bundle, "_built", {})
    assert b"<clusterrun run.py>" in bundle.program_source("run.py")
