"""What gets copied to the hosts."""

from __future__ import annotations

from pathlib import Path

from clusterrun.launch import sync


def test_gitignore_next_to_the_script_keeps_checkpoints_out_of_the_copy(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("# outputs\ncheckpoints/\n!keep.pt\n*.log\n")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "model.pt").write_bytes(b"x")
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "run.log").write_text("noise\n")
    patterns = sync.DEFAULT_EXCLUDES + sync.gitignored(tmp_path)
    assert sorted(sync.manifest(tmp_path, patterns)) == [".gitignore", "train.py"]
