"""The programs a warm agent keeps (remote/hostlib/warmrun.py ``Programs``): a program it
was sent before (the same bytes) is neither compiled nor unpacked again in the fork that
runs it, and what runs is exactly what BOOTSTRAP would have run."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from clusterrun.remote.hostlib import warmrun
from clusterrun.transport import bundle


def _bundle(main: str) -> bytes:
    """A program as bundle.py builds one, importing shared/timing.py."""
    return bundle._build("says.py", main.encode(), [
        ("shared/timing.py", bundle._remote_source("shared/timing.py"))])


def test_the_same_program_is_prepared_once_another_one_anew(
        monkeypatch: pytest.MonkeyPatch) -> None:
    prepared: list[bytes] = []
    real = warmrun._prepared

    def counted(program: bytes, loader: bytes) -> Any:
        prepared.append(program)
        return real(program, loader)

    monkeypatch.setattr(warmrun, "_prepared", counted)
    kept = warmrun.Programs(bundle.LOADER_DEFS, keep=2)
    first = kept.get(b"print(1)")
    assert kept.get(b"print(1)") is first and prepared == [b"print(1)"]
    assert kept.get(b"print(2)") is not first and len(prepared) == 2
    kept.get(b"print(1)")  # the newest again: print(2) is the oldest now
    kept.get(b"print(3)")
    assert kept.get(b"print(1)") is first and len(prepared) == 3
    kept.get(b"print(2)")
    assert len(prepared) == 4  # it had been forgotten
    assert kept.get(b"def (") is None and kept.get(b"def (") is None and len(prepared) == 5


def test_a_bundles_pieces_are_unpacked_by_its_loader_and_used_by_it() -> None:
    program = _bundle("print('main')\n")
    found = warmrun.Programs(bundle.LOADER_DEFS).get(program)
    assert found is not None
    code, run_in = found
    pieces = run_in["_clusterrun_kept"]
    assert sorted(piece.co_filename for piece in pieces.values()) == [
        "<clusterrun clusterrun.remote.shared.timing>", "<clusterrun says.py>"]
    # What runs is what was kept: a piece swapped here is what the loader runs.
    for packed, piece in list(pieces.items()):
        if piece.co_filename == "<clusterrun says.py>":
            pieces[packed] = compile("raise LookupError('kept')", piece.co_filename, "exec")
    saved = dict(sys.modules)  # the loader puts its own clusterrun modules in their place
    try:
        with pytest.raises(LookupError, match="kept"):
            exec(code, dict(run_in))
    finally:
        for name in set(sys.modules) - set(saved):
            del sys.modules[name]
        sys.modules.update(saved)
    assert warmrun.Programs(None).get(program)[1] == {"__name__": "__main__"}  # type: ignore[index]
