"""Which environment names are secrets: whole `_`-separated words from one list, the same list
the docs and `--dry-run` show; and `--env NAME` forwarding a value from this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterrun.errors import UsageError
from clusterrun.plan import secrets
from clusterrun.plan.build import parse_env
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
