"""What one `docker exec -i` and one `podman exec -i` cost: the price each program clusterrun
starts in a `container:` host pays (docs/containers.md, "Costs").

One sandbox host gets both engines (tests/support/containers.py and docker.py) and an idle
container in each, from the same few-KB image; each round runs `ENGINE exec -i box true` for
both, and the host's own `true` for the floor, in turn (A B C A B C ...), inside the host as an
SSH session there would (no SSH in the figure). Writes the medians, the samples, the commit and
the machine as JSON (--out).

    sudo .venv/bin/python benchmarks/engines.py --rounds 30
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, cluster  # puts the repository on sys.path

from clusterrun import sandbox
from clusterrun.sandbox import cluster as sandbox_cluster
from clusterrun.sandbox import dockerd, sshd
from tests.support import containers, docker

HOST, BOX = "node1", "box"


def timed(sb: sandbox.Sandbox, argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    sandbox.exec_in(sb, HOST, argv, env=env, capture_output=True, timeout=60, check=True)
    return time.perf_counter() - start


def machine() -> dict[str, object]:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def version(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()
    return {"cpus": os.cpu_count(), "memory_gib": round(memory / 2**30, 1),
            "kernel": platform.release(), "load_before": os.getloadavg(),
            "dockerd": version(["dockerd", "--version"]),
            "docker": version(["env", f"PATH={sshd.SESSION_ENV['PATH']}", "docker", "--version"]),
            "podman": version(["podman", "--version"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "engines.json")
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    info = machine()
    with cluster(1) as sb:
        containers.enable(sb, [HOST])
        containers.run(sb, HOST, BOX)
        docker.enable(sb, [HOST])
        docker.run(sb, HOST, BOX)
        view = sandbox_cluster.read_state(sb.root).view
        with_docker = {**sshd.SESSION_ENV,
                       "DOCKER_HOST": f"unix://{dockerd.socket_path(view, HOST)}"}
        candidates = {
            "docker exec -i": (["docker", "exec", "-i", BOX, "true"], with_docker),
            "podman exec -i": (["podman", "exec", "-i", BOX, "true"], dict(sshd.SESSION_ENV)),
            "true (the floor)": (["true"], dict(sshd.SESSION_ENV)),
        }
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        for _ in range(args.rounds):
            for name, (argv, env) in candidates.items():
                samples[name].append(timed(sb, argv, env))
    medians = {name: round(statistics.median(values), 3) for name, values in samples.items()}
    for name, value in medians.items():
        print(f"{name:18} median {value:.3f} s over {args.rounds} rounds")
    info["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps({
        "command": " ".join(["benchmarks/engines.py", *sys.argv[1:]]), "commit": commit,
        "machine": info, "median_s": medians, "samples_s": samples}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
