"""A warm command's start: from the process's start to the first byte it writes on the session
daemon's socket (the budget is 80 ms), and which of paramiko, fabric, invoke and cryptography
it has loaded by then.

    .venv/bin/python benchmarks/client_start.py                       # this checkout, 20 rounds
    .venv/bin/python benchmarks/client_start.py --baseline main       # side by side with main
    .venv/bin/python benchmarks/client_start.py --baseline-tree DIR   # ... with any checkout

No sshd and no root: a stand-in daemon, in this process, listens on the socket the command
looks for (its own private CLUSTERRUN_HOME), notes when the first byte of each command arrives,
says that the known_hosts files are fine and that the host (one SSH host at a closed loopback
port) cannot be reached, so the command ends there with exit 4. The time is taken just before
the command is started; both clocks are this machine's monotonic one. Each tree is
byte-compiled first, as pip installs it, and run with PYTHONDONTWRITEBYTECODE removed; the
trees take turns (A B A B ...). `-X importtime` of one more run gives the imports' own sum and
the heaviest top-level ones; the interpreter's own start, and with click and yaml imported, in
the same rounds, say what no command line could undercut. Prints Markdown; --json writes the
samples.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import common
from common import markdown_table

from clusterrun.remote.shared import frames

HEAVY = ("paramiko", "fabric", "invoke", "cryptography")
# What no clusterrun can start faster than, timed in the same rounds: the interpreter alone
# (with this environment's site-packages), and with the two libraries a command parses with.
FLOORS = {"python -c pass": "pass", "python -c 'import click, yaml'": "import click, yaml"}
BUDGET_MS = 80.0
KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIJIFQvGOPArW9lGI3cyGA1OO1imdKwewJ9ZpdfijiDGg"


class StandIn:
    """A daemon that only notes the first byte of each command and sends it away."""

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.first: Optional[float] = None
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _recv(self, conn: socket.socket, size: int) -> bytes:
        data = conn.recv(size)
        now = time.monotonic()
        with self.lock:
            if data and self.first is None:
                self.first = now
        return data

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    frame = frames.read_frame(lambda n: self._recv(conn, n))
                except (OSError, frames.FrameError):
                    return
                if frame is None:
                    return
                kind, rid, payload = frame
                if kind != frames.RUN:
                    continue
                asked = frames.loads(payload)
                if asked.get(frames.CONTROL) == "known_hosts":
                    conn.sendall(frames.encode(frames.STDOUT, rid, b'{"ok": true}'))
                    conn.sendall(frames.encode(frames.EXIT, rid, b'{"status": 0}'))
                    continue
                conn.sendall(frames.encode(frames.ERROR, rid, json.dumps(
                    {"outcome": "UNREACHABLE",
                     "message": "node: the stand-in daemon reaches no host."}).encode()))

    def close(self) -> None:
        self.listener.close()


class Tree:
    """One checkout, its private home and its stand-in daemon."""

    def __init__(self, label: str, path: Path, scratch: Path, inventory: Path) -> None:
        self.label, self.path, self.inventory = label, path, inventory
        home = scratch / label
        home.mkdir()
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env.update(CLUSTERRUN_HOME=str(home), CLUSTERRUN_SESSION="1",
                        PYTHONPATH=str(path))
        common.compiled(path)
        where = subprocess.run(
            [sys.executable, "-c", "from clusterrun.session import paths\n"
             "print(paths.socket_path())"], env=self.env, cwd=path, capture_output=True,
            text=True, check=True).stdout.strip()
        self.daemon = StandIn(where)
        self.first_ms: list[float] = []
        self.wall_ms: list[float] = []

    def argv(self, *python: str) -> list[str]:
        return [sys.executable, *python, "-m", "clusterrun", "exec", "--connect-timeout", "5",
                str(self.inventory), "--", "true"]

    def once(self) -> None:
        self.daemon.first = None
        start = time.monotonic()
        cp = subprocess.run(self.argv(), env=self.env, cwd=self.path, capture_output=True,
                            text=True, timeout=60, check=False)
        end = time.monotonic()
        if cp.returncode != 4 or self.daemon.first is None:
            raise SystemExit(f"{self.label}: expected exit 4 through the stand-in daemon, got "
                             f"{cp.returncode}:\n{cp.stderr}")
        self.first_ms.append((self.daemon.first - start) * 1000)
        self.wall_ms.append((end - start) * 1000)

    def imports(self) -> dict[str, Any]:
        """One `-X importtime` run: the sum of every import's own time, the heaviest
        top-level imports (with what they import), and the HEAVY packages imported at all."""
        cp = subprocess.run(self.argv("-X", "importtime"), env=self.env, cwd=self.path,
                            capture_output=True, text=True, timeout=60, check=False)
        own, top, heavy = 0, [], set()
        for line in cp.stderr.splitlines():
            found = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
            if not found:
                continue
            own += int(found.group(1))
            name = found.group(4)
            if name.split(".")[0] in HEAVY:
                heavy.add(name.split(".")[0])
            if len(found.group(3)) == 1:
                top.append((int(found.group(2)), name))
        top.sort(reverse=True)
        return {"own_ms": own / 1000, "heavy": sorted(heavy),
                "top": [f"{name} {us / 1000:.0f}" for us, name in top[:6]]}


def floor(code: str, env: dict[str, str]) -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    return (time.monotonic() - start) * 1000


@contextlib.contextmanager
def baseline(rev: Optional[str], tree: Optional[str]) -> Iterator[Optional[Path]]:
    if tree:
        yield Path(tree).resolve()
    elif rev:
        with common.checkout(rev) as path:
            yield path
    else:
        yield None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--baseline", metavar="REV", help="also measure clusterrun at REV")
    parser.add_argument("--baseline-tree", metavar="DIR", help="also measure this checkout")
    parser.add_argument("--json", metavar="PATH", type=Path, help="write the samples here")
    args = parser.parse_args()
    prov = common.provenance()
    with tempfile.TemporaryDirectory(prefix="crs-") as tmp, \
            baseline(args.baseline, args.baseline_tree) as base:
        scratch = Path(tmp)
        known = scratch / "known_hosts"
        known.write_text(f"10.0.0.1 ssh-ed25519 {KEY}\n")
        inv = scratch / "inv.yaml"
        with socket.socket() as sock:  # a port nothing listens on: nothing leaves this machine
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        inv.write_text(f"defaults:\n  known_hosts: {known}\nhosts:\n"
                       f"  - host: 127.0.0.2\n    port: {port}\n")
        trees = [Tree("this", common.REPO, scratch, inv)]
        if base is not None:
            trees.append(Tree("baseline", base, scratch, inv))
        for tree in trees:
            tree.once()  # untimed: the page cache, and any .pyc compileall left out
            tree.first_ms.clear()
            tree.wall_ms.clear()
        floors: dict[str, list[float]] = {label: [] for label in FLOORS}
        for _ in range(args.repeat):
            for tree in trees:
                tree.once()
            for label, code in FLOORS.items():
                floors[label].append(floor(code, trees[0].env))
        found = {tree.label: tree.imports() for tree in trees}
        for tree in trees:
            tree.daemon.close()
    rows = [[tree.label, statistics.median(tree.first_ms), min(tree.first_ms),
             statistics.median(tree.wall_ms), found[tree.label]["own_ms"],
             ", ".join(found[tree.label]["heavy"]) or "none"] for tree in trees]
    print("\n".join(common.provenance_lines(common.finish(prov))))
    print(f"\n`exec` through the warm session, {args.repeat} rounds; budget to the first byte: "
          f"{BUDGET_MS:.0f} ms\n")
    print(markdown_table(["tree", "first byte, median ms", "min ms", "command, median ms",
                          "imports' own ms", "heavy imported"], rows))
    print("\nIn the same rounds, no clusterrun (process start to exit, median ms): " + "; ".join(
        f"`{label}` {statistics.median(ms):.1f}" for label, ms in floors.items()))
    for tree in trees:
        print(f"\n{tree.label}: heaviest top-level imports (ms, with theirs): "
              + "; ".join(found[tree.label]["top"]))
    if args.json:
        args.json.write_text(json.dumps({"provenance": prov, "trees": {
            tree.label: {"path": str(tree.path), "first_ms": tree.first_ms,
                         "wall_ms": tree.wall_ms, **found[tree.label]} for tree in trees},
            "floors_ms": floors},
            indent=1))


if __name__ == "__main__":
    main()
