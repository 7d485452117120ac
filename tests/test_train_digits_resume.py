"""payloads/train_digits.py is restartable (issue 13): run under torch's own launcher on this
machine (CPU, Gloo, two ranks), a run killed after epoch 1 and restarted ends with exactly the
parameters of an uninterrupted run with the same seed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# Three torchruns of two ranks each: about half a minute of CPU on two cores.
pytestmark = pytest.mark.slow

EPOCHS = 3
# Inherited values would change what the runs do: the tests set them where they mean to.
OWN_VARS = ("CLUSTERRUN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT",
            "TRAIN_DIGITS_CRASH_AFTER_EPOCH", "TRAIN_DIGITS_CRASH_RANK")


def train(checkpoint_dir: Path, *args: str, max_restarts: int = 0,
          **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in OWN_VARS}
    # torchrun sets it to 1 anyway; saying so keeps its warning banner out of the output.
    base["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--max-restarts", str(max_restarts), "payloads/train_digits.py",
         "--epochs", str(EPOCHS), "--seed", "0", "--checkpoint-dir", str(checkpoint_dir), *args],
        cwd=REPO, env={**base, **env}, capture_output=True, text=True, timeout=240, check=False)


def digest(cp: subprocess.CompletedProcess[str]) -> str:
    found = re.findall(r"^final parameter sha256 ([0-9a-f]{64})$", cp.stdout, re.M)
    assert len(found) == 1, cp.stdout + cp.stderr
    return found[0]


def test_a_run_killed_after_epoch_1_resumes_to_the_uninterrupted_parameters(
        tmp_path: Path) -> None:
    import torch

    # Uninterrupted, asked to resume from an empty folder: it starts from scratch.
    fresh = train(tmp_path / "empty", "--resume")
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert f"no checkpoint at {tmp_path / 'empty' / 'digits_ddp.pt'}, starting from scratch" \
        in fresh.stdout
    assert re.search(r"^final test accuracy 0\.9\d+ \(3 epochs, 2 ranks", fresh.stdout, re.M)
    uninterrupted = digest(fresh)

    crashed = train(tmp_path / "run", TRAIN_DIGITS_CRASH_AFTER_EPOCH="1")
    assert crashed.returncode != 0
    assert "rank 1: TRAIN_DIGITS_CRASH_AFTER_EPOCH=1: exiting with code 1" in crashed.stderr
    assert re.search(r"^epoch 1/3 ", crashed.stdout, re.M)
    assert not re.search(r"^epoch 2/3 ", crashed.stdout, re.M)
    # Written atomically: the finished file only, no temp file beside it.
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["digits_ddp.pt"]
    ckpt = torch.load(tmp_path / "run" / "digits_ddp.pt", map_location="cpu", weights_only=True)
    assert ckpt["epoch"] == 1
    assert len(ckpt["rng"]) == 2  # one random state per rank

    # As clusterrun restarts a run: same command and environment, a restart count above 0
    # (the crash switch only acts on a first attempt).
    resumed = train(tmp_path / "run", TRAIN_DIGITS_CRASH_AFTER_EPOCH="1",
                    CLUSTERRUN_RESTART_COUNT="1")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {tmp_path / 'run' / 'digits_ddp.pt'} after epoch 1\n" in resumed.stdout
    assert "epochs 2..3" in resumed.stdout
    assert re.findall(r"^epoch (\d)/3 ", resumed.stdout, re.M) == ["2", "3"]
    assert digest(resumed) == uninterrupted
