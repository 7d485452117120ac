"""`environment:`: a cold sync of the torch lock next to rsync from the controller, and a warm
launch's extra time.

1. cold: `clusterrun env --json` on hosts that have nothing (wall time; bytes over the
   controller's own link, from the command's own count);
2. rsync: the environment built on the first host copied from the controller to every other
   host with one `rsync -a` per host in parallel, as one would push a built venv (wall time;
   bytes sent, from rsync's --stats);
3. warm: `launch --dry-run` with and without `environment:` (alternating, median of --rounds),
   the extra time a launch pays when every host already holds the lock's environment.

Each host's environment unpacks a CPU torch (about 700 MB), and rsync makes a second copy:
mind the disk at many hosts. `--light` syncs a numpy-only lock instead (the warm launch's extra
time hardly depends on the lock's size).

    sudo .venv/bin/python benchmarks/environments.py --sizes 8 --rounds 3
    sudo .venv/bin/python benchmarks/environments.py --sizes 32 --light
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from common import REPO, cluster, finish, provenance, ssh_argv  # puts the repository on sys.path

from clusterrun import sandbox

TORCH_DEPS = ("filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec", "mpmath",
              "markupsafe", "setuptools")
WORKDIR = "/tmp/clusterrun-bench-env"
PAYLOAD = "print('hello')\n"


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterrun", *args], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "CLUSTERRUN_HOME": str(home)},
                          check=False, timeout=3600)


def inventory(sb: sandbox.Sandbox, path: Path, n: int, *, environment: bool) -> Path:
    doc = yaml.safe_load(sb.inventory.read_text())
    doc["defaults"].update({"python": "/usr/bin/python3", "workdir": WORKDIR})
    if environment:
        doc["defaults"]["environment"] = "requirements.lock"
    else:  # the same hosts, torch from the controller's own Python, as without `environment:`
        doc["defaults"]["python"] = sys.executable
    doc["hosts"] = doc["hosts"][:n]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def rsync_all(sb: sandbox.Sandbox, n: int, env_dir: str) -> tuple[float, int]:
    """The first host's environment pushed from this machine to every other host."""
    source = sb.root / sb.hosts[0].name / "tmp" / os.path.relpath(env_dir, "/tmp")
    ssh = " ".join(ssh_argv(sb))
    began = time.perf_counter()
    procs = [subprocess.Popen(["rsync", "-a", "--stats", "-e", ssh, f"{source}/",
                               f"{h.address}:{env_dir}-rsync/"], stdout=subprocess.PIPE,
                              text=True) for h in sb.hosts[1:n]]
    sent = 0
    for proc in procs:
        out, _ = proc.communicate()
        match = re.search(r"Total bytes sent: ([\d,.]+)", out)
        sent += int(re.sub(r"[,.]", "", match.group(1))) if match else 0
    return time.perf_counter() - began, sent


def dry_run(home: Path, inv: Path, script: Path, *extra: str) -> float:
    began = time.perf_counter()
    cp = cli(home, "launch", "--dry-run", *extra, str(inv), str(script))
    if cp.returncode != 0:
        raise RuntimeError(cp.stderr[-2000:])
    return time.perf_counter() - began


def one_size(tmp: Path, n: int, rounds: int, *, light: bool) -> dict[str, Any]:
    home = tmp / f"home{n}"
    with cluster(n) as sb:
        inv = inventory(sb, tmp / f"env{n}.yaml", n, environment=True)
        plain = inventory(sb, tmp / f"plain{n}.yaml", n, environment=False)
        began = time.perf_counter()
        cp = cli(home, "env", "--json", str(inv))
        cold = time.perf_counter() - began
        if cp.returncode != 0:
            raise RuntimeError(cp.stderr[-2000:])
        found = json.loads(cp.stdout)
        env_dir = found["hosts"][0]["path"]
        rsync_s, rsync_bytes = rsync_all(sb, n, env_dir)
        script = tmp / "job" / "hello.py"
        # A light lock has no torch, which preflight would refuse: both without the checks.
        extra = ("--no-check",) if light else ()
        warm: list[float] = []
        base: list[float] = []
        for _ in range(rounds):  # alternating, so the machine's drift falls on both alike
            warm.append(dry_run(home, inv, script, *extra))
            base.append(dry_run(home, plain, script, *extra))
    return {"hosts": n, "cold_s": round(cold, 1), "cold_sent_mb": found["sent_bytes"] / 1e6,
            "rsync_s": round(rsync_s, 1), "rsync_sent_mb": rsync_bytes / 1e6,
            "warm_dry_run_s": statistics.median(warm), "plain_dry_run_s": statistics.median(base),
            "warm_extra_s": statistics.median(warm) - statistics.median(base)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--light", action="store_true", help="a numpy-only lock")
    parser.add_argument("--out", default=None,
                        help="default: benchmarks/environments[-light].json")
    args = parser.parse_args()
    prov = provenance()
    results = []
    with tempfile.TemporaryDirectory(prefix="clusterrun-envbench-") as folder:
        tmp = Path(folder)
        pins = [f"{name}=={metadata.version(name)}" for name in TORCH_DEPS]
        (tmp / "requirements.lock").write_text("numpy==2.3.4\n" if args.light else
                                               "torch==2.13.0+cpu\nnumpy==2.3.4\n"
                                               + "\n".join(pins) + "\n")
        (tmp / "job").mkdir()
        (tmp / "job" / "hello.py").write_text(PAYLOAD)
        for n in (int(x) for x in args.sizes.split(",")):
            results.append(dict(one_size(tmp, n, args.rounds, light=args.light), light=args.light))
            print(json.dumps(results[-1]), flush=True)
    name = "environments-light.json" if args.light else "environments.json"
    record = {"provenance": finish(prov), "results": results}  # what the figures came from
    Path(args.out or Path(__file__).with_name(name)).write_text(json.dumps(record, indent=1)
                                                                + "\n")


if __name__ == "__main__":
    main()
