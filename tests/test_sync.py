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


def test_env_files_hold_secrets_and_are_never_copied(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / ".env").write_text("DB_PASS=x\n")
    (tmp_path / ".env.prod").write_text("DB_PASS=y\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "job.env").write_text("HF_TOKEN=z\n")  # named by --env-file
    (tmp_path / "conf" / "other.env").write_text("A=1\n")
    anchored = sync.env_file_excludes(tmp_path, [str(tmp_path / "conf" / "job.env"), None,
                                                 "/elsewhere/x.env"])
    assert anchored == ("/conf/job.env",)
    copied = sorted(sync.manifest(tmp_path, sync.DEFAULT_EXCLUDES + anchored))
    assert copied == ["conf/other.env", "train.py"]
