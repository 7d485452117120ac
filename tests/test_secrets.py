"""Which environment names are secrets: whole `_`-separated words from one list, the same list
the docs and `--dry-run` show; and `--env NAME` forwarding a value from this machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clusterrun.errors import UsageError
from clusterrun.plan import secrets
from clusterrun.plan.build import parse_env
from clusterrun.runs import masking, store
from clusterrun.runs.journal import Journal, RunRecord
from clusterrun.runs.masking import Masks
from tests.conftest import REPO, run_cli

SECRET = ["DB_PASS", "GITHUB_PAT", "HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY",
          "PGPASSWORD_FILE_X_PASSWORD", "MYSQL_PASSWD", "SSH_PRIVATE_KEY", "API_KEYS",
          "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CREDENTIAL", "BASIC_AUTH", "db_password",
          "OPENAI_APIKEY", "SECRET", "DB_PASSWORD2", "TOKEN_1", "hf_token", "SESSION_COOKIE",
          "VAULT_PASSPHRASE", "AWS_CREDS"]
PLAIN = ["MONKEY", "KEYBOARD", "KEYBOARD_LAYOUT", "DONKEY_COUNT", "PATH", "PATTERN", "PASSAGE",
         "NCCL_DEBUG", "TOKENIZERS_PARALLELISM", "COMPASS", "AUTHOR", "SECRETARY", "PWD",
         "OMP_NUM_THREADS", "BYPASS_CACHE"]


@pytest.mark.parametrize("name", SECRET)
def test_secret_names(name: str) -> None:
    assert secrets.is_secret(name)


@pytest.mark.parametrize("name", PLAIN)
def test_plain_names(name: str) -> None:
    assert not secrets.is_secret(name)


def test_masked_keeps_plain_values() -> None:
    assert secrets.masked({"DB_PASS": "hunter2", "MONKEY": "banana"}) == {
        "DB_PASS": secrets.MASK, "MONKEY": "banana"}


def test_docs_say_what_the_list_says() -> None:
    """docs/security.md states the rule in the very words `--dry-run` prints, made from the one
    list: a word added to or removed from the list fails this test until the docs follow."""
    doc = (REPO / "docs" / "security.md").read_text()
    section = doc.split("## Secrets", 1)[1].split("\n## ", 1)[0]
    assert secrets.describe() in " ".join(section.split())


def test_dry_run_masks_whole_words_and_names_the_list(tmp_path: Path) -> None:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - host: localhost\n    nproc_per_node: 1\n")
    cp = run_cli("launch", "--dry-run", "--env", "DB_PASS=hunter2", "--env", "GITHUB_PAT=ghp_x",
                 "--env", "MONKEY=banana", "--env", "HF_TOKEN", str(inv), str(script),
                 env={"CLUSTERRUN_HOME": str(tmp_path / "home"), "HF_TOKEN": "hf_canary"},
                 timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "DB_PASS=******" in cp.stdout and "GITHUB_PAT=******" in cp.stdout
    assert "HF_TOKEN=******" in cp.stdout
    assert "MONKEY=banana" in cp.stdout
    assert "hunter2" not in cp.stdout and "ghp_x" not in cp.stdout and "hf_canary" not in cp.stdout
    assert secrets.describe() in " ".join(cp.stdout.split())


def test_env_name_alone_forwards_this_machines_value() -> None:
    assert parse_env(["HF_TOKEN", "A=1", "EMPTY"], environ={"HF_TOKEN": "hf_x", "EMPTY": ""}) \
        == {"HF_TOKEN": "hf_x", "A": "1", "EMPTY": ""}


def test_env_name_alone_must_be_set(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--env HF_TOKEN: HF_TOKEN is not set"):
        parse_env(["HF_TOKEN"], environ={})
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - host: localhost\n")
    cp = run_cli("launch", "--dry-run", "--env", "NOT_SET_ANYWHERE_X", str(inv), "x.py",
                 env={"CLUSTERRUN_HOME": str(tmp_path / "home")}, timeout=60)
    assert cp.returncode == 2
    assert cp.stderr.startswith("clusterrun: error: --env NOT_SET_ANYWHERE_X: ")
    assert "Traceback" not in cp.stderr


# -- the masks' key is kept apart from the run's folder ------------------------------------------

RUN_ID = "20260101-000000-train-0001"
TOKEN = "hf_" + "q7" * 12


def _started(home: Path) -> Journal:
    masks = Masks.of_env([("HF_TOKEN", TOKEN), ("LR", "0.1")])
    return Journal.start(home, RunRecord(RUN_ID, "train", ("a",), "inv.yaml"),
                         {"run_id": RUN_ID}, masks=masks)


def test_the_run_folder_holds_no_key_and_the_key_file_is_the_users_alone(tmp_path: Path) -> None:
    """With the key, the digests in masks.json let anyone holding a run folder test guesses
    offline: the key is kept under $CLUSTERRUN_HOME/keys, 0600, never in runs/<id>/."""
    journal = _started(tmp_path / "home")
    kept = json.loads(journal.run.file("masks.json").read_text())
    assert sorted(kept) == ["digests"]
    key_file = masking.key_path(journal.run)
    assert key_file == tmp_path / "home" / "keys" / RUN_ID
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.parent.stat().st_mode & 0o777 == 0o700
    key = key_file.read_text().strip()
    assert len(key) == 32 and key == journal.masks.key.hex()
    for path in journal.run.path.rglob("*"):
        if path.is_file():
            assert key not in path.read_text(), path
    assert not [p.name for p in key_file.parent.iterdir() if p.name != RUN_ID]  # no leftovers


def test_a_later_command_masks_alike_and_a_copied_folder_masks_names_only(
        tmp_path: Path) -> None:
    journal = _started(tmp_path / "home")
    # A later command of the same user (`ps`, a detached run's watcher) has the folder and home.
    later = Journal(journal.run)
    assert later.masks.text(f"got {TOKEN}; HF_TOKEN={TOKEN}") == "got ******; HF_TOKEN=******"
    # The run folder copied elsewhere (a bug report): its digests are no use without the key.
    copy = tmp_path / "elsewhere" / "runs" / RUN_ID
    shutil.copytree(journal.run.path, copy)
    found = Masks.load(store.RunDir(copy))
    assert found.digests == {} and found.text(f"got {TOKEN}") == f"got {TOKEN}"
    assert found.text(f"HF_TOKEN={TOKEN}") == "HF_TOKEN=******"


def test_a_run_from_before_keeps_its_key_in_masks_json_and_is_read(tmp_path: Path) -> None:
    journal = _started(tmp_path / "home")
    kept = json.loads(journal.run.file("masks.json").read_text())
    key_file = masking.key_path(journal.run)
    kept["key"] = key_file.read_text().strip()
    key_file.unlink()
    store.write_json(journal.run.file("masks.json"), kept)
    assert Masks.load(journal.run).text(f"said {TOKEN}") == "said ******"


def test_values_under_four_characters_are_masked_only_after_their_name() -> None:
    """docs/security.md says so: masking a 1-3 character value everywhere would mangle output."""
    masks = Masks.of_env([("DB_PASS", "abc")])
    assert masks.text("abc DB_PASS=abc") == "abc DB_PASS=******"
