"""`clusterrun top` against the namespace cluster: real sshd, real torchrun and gloo. What it
reports is checked against the hosts themselves (their processes, their log files), also for a
detached run whose controller is gone, an attached run (drawn in a real terminal), a crashed
host, a stalled run, a container host and a Slurm host."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from clusterrun import sandbox
from clusterrun.observe.frame import LOST, OK, Frame
from clusterrun.observe.watch import Watch
from clusterrun.runs import names
from clusterrun.transport import SshOptions
from tests.conftest import (
    Cluster,
    Containers,
    Reader,
    clusterrun_argv,
    copy_payload,
    run_cli,
    start_cli,
)
from tests.support import faults
from tests.support.slurm import SlurmCluster

pytestmark = pytest.mark.cluster

HOSTS = ["node9", "node10"]
HOST_KEYS = {"node", "cpu_percent", "mem_used_mb", "mem_total_mb", "net_rx_mbps", "net_tx_mbps",
             "gpus"}
RANK_KEYS = {"rank", "node", "pid", "cpu_percent", "rss_mb", "lines_per_min", "last_line",
             "silent_s"}


@pytest.fixture
def ticker(tmp_path: Path) -> Path:
    return copy_payload(tmp_path, "ticker.py", "ticker")


@pytest.fixture
def revive(cluster: Cluster) -> Iterator[list[str]]:
    """Hosts appended here were crashed by the test; their sshd is started again after."""
    crashed: list[str] = []
    yield crashed
    for name in crashed:
        cluster.sb = faults.revive(cluster.sb.root, name)


@pytest.fixture
def strays(cluster: Cluster) -> Iterator[None]:
    yield
    cluster.kill_all(HOSTS)


def detach(inv: Path, script: Path, *env: str, nproc: int = 2) -> str:
    args = [x for e in env for x in ("--env", e)]
    cp = run_cli("launch", "--detach", "--nproc-per-node", str(nproc), "--grace", "3", *args,
                 str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    match = re.search(r"run (\S+) started on", cp.stderr)
    assert match, cp.stderr
    return match.group(1)


def log_path(run_id: str, host: str, rank: int) -> str:
    return f"/tmp/clusterrun/runs/{run_id}/{host}/rank-{rank}.log"


def wait_lines(cluster: Cluster, run_id: str, hosts: dict[str, list[int]], count: int = 3,
               timeout: float = 120) -> None:
    """Until every rank's log on its host has ``count`` lines."""
    deadline = time.monotonic() + timeout
    for host, ranks in hosts.items():
        for rank in ranks:
            while True:
                text = cluster.run_on(host, "sh", "-c",
                                      f"cat {log_path(run_id, host, rank)} 2>/dev/null || true")
                if text.count("\n") >= count:
                    break
                assert time.monotonic() < deadline, f"{host} rank {rank}: {text!r}"
                time.sleep(0.5)


def top_once(run_id: str, *extra: str) -> dict:
    cp = run_cli("top", run_id, "--once", "--json", "--interval", "1", *extra, timeout=120)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def netns_pids(cluster: Cluster, host: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", cluster.host(host).netns], capture_output=True,
                         text=True, check=True).stdout
    return {int(p) for p in out.split()}


def samplers(cluster: Cluster, host: str) -> list[int]:
    """The host's clusterrun programs at the lowest priority (nice 19): top's samplers."""
    found = []
    for pid in netns_pids(cluster, host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            nice = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, ValueError, IndexError):
            continue
        if b"<clusterrun>" in cmdline and nice == 19:
            found.append(pid)
    return found


def test_top_json_matches_what_the_hosts_run(cluster: Cluster, home: Path, tmp_path: Path,
                                             ticker: Path, strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    run_id = detach(inv, ticker, "STEP_SLEEP=0.3")
    # The launch returned: this run has no controller, `top` reaches its hosts on its own.
    wait_lines(cluster, run_id, {"node9": [0, 1], "node10": [2, 3]})
    sample = top_once(run_id)
    assert set(sample) == {"ok", "run", "hosts", "ranks"} and sample["run"] == run_id
    assert sample["ok"] is True  # every host answered
    assert [h["node"] for h in sample["hosts"]] == HOSTS
    for host in sample["hosts"]:
        assert set(host) == HOST_KEYS, host
        assert host["mem_total_mb"] > 0 and host["cpu_percent"] is not None
        assert host["net_rx_mbps"] is not None and host["gpus"] == []
    # The gloo all-reduce crosses the run's interface: some traffic is counted there.
    assert any(h["net_rx_mbps"] > 0 for h in sample["hosts"]), sample["hosts"]
    assert [r["rank"] for r in sample["ranks"]] == [0, 1, 2, 3]
    for rank in sample["ranks"]:
        assert set(rank) == RANK_KEYS, rank
        host = rank["node"]
        assert host == ("node9" if rank["rank"] < 2 else "node10")
        # Its pid is a process of that host, and it is that rank's python, running ticker.py.
        assert rank["pid"] in netns_pids(cluster, host), rank
        environ = Path(f"/proc/{rank['pid']}/environ").read_bytes().split(b"\0")
        assert f"RANK={rank['rank']}".encode() in environ
        assert b"ticker.py" in Path(f"/proc/{rank['pid']}/cmdline").read_bytes()
        # Its last line is one the rank wrote to its log on its host, and a recent one.
        lines = cluster.read(host, log_path(run_id, host, rank["rank"])).splitlines()
        assert rank["last_line"] in lines[-20:], (rank, lines[-3:])
        assert rank["last_line"].startswith("step ") and f"rank {rank['rank']} " in \
            rank["last_line"]
        assert rank["silent_s"] < 10 and rank["rss_mb"] > 10
        assert rank["lines_per_min"] > 0
    stop = run_cli("stop", run_id)
    assert stop.returncode == 0, stop.stderr
    assert cluster.wait_run_gone(HOSTS, run_id, 20) == {}


def test_top_once_answers_from_what_the_supervisors_kept(cluster: Cluster, home: Path,
                                                         tmp_path: Path, ticker: Path,
                                                         strays: None) -> None:
    """Each host's supervisor keeps its last seconds of counter readings in the rundir: a
    `top --once` with a 6 s window answers in less than that, every rate filled in (a second
    command with the session on, warm), and the readings go when the run ends."""
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    run_id = detach(inv, ticker, "STEP_SLEEP=0.3", nproc=1)
    wait_lines(cluster, run_id, {"node9": [0], "node10": [1]}, count=10)
    kept = f"/tmp/clusterrun/runs/{run_id}/node9/counters.json"
    readings = json.loads(cluster.read("node9", kept))["readings"]
    assert len(readings) >= 4 and set(readings[-1]["pids"]) == {"0"}, readings[-1]
    for _ in range(2):  # the second is warm with the session on
        began = time.monotonic()
        cp = run_cli("top", run_id, "--once", "--json", "--interval", "4", timeout=120)
        took = time.monotonic() - began
        assert cp.returncode == 0, cp.stderr
    # Waiting out the window alone would take 4 s, the command's start and connections besides.
    assert took < 4, took
    sample = json.loads(cp.stdout)
    assert sample["ok"] is True
    assert all(h["cpu_percent"] is not None and h["net_rx_mbps"] is not None
               for h in sample["hosts"]), sample["hosts"]
    for rank in sample["ranks"]:
        assert rank["cpu_percent"] is not None and rank["lines_per_min"] > 0, rank
    assert run_cli("stop", run_id).returncode == 0
    assert cluster.wait_run_gone(HOSTS, run_id, 20) == {}
    assert "gone" in cluster.run_on("node9", "sh", "-c", f"test -e {kept} || echo gone")


def refreshes_until_lost(watch: Watch, node: str, most: int = 5) -> tuple[int, Frame]:
    """How many refreshes it took ``node`` to show as LOST (``most`` + 1: it never did), and
    the frame that showed it. Counted in refreshes, not seconds: a refresh waits a whole
    interval for a host whose connection is open but silent, so n refreshes span n intervals
    however loaded this machine is (load only makes them longer)."""
    for count in range(1, most + 1):
        frame = watch.refresh()
        if next(h for h in frame.hosts if h.node == node).status == LOST:
            return count, frame
    return most + 1, frame


def test_a_crashed_host_turns_lost_within_two_intervals(cluster: Cluster, home: Path,  # noqa: PLR0917
                                                         tmp_path: Path, ticker: Path,
                                                         revive: list[str], strays: None,
                                                         partitioned: list[str]) -> None:
    """A host whose processes die (its connection closes) and one cut off from the network
    (no FIN: the connection stays open and silent, as when a machine loses power) both turn
    LOST within two refresh intervals."""
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    run_id = detach(inv, ticker, nproc=1)
    wait_lines(cluster, run_id, {"node9": [0], "node10": [1]}, count=1)
    run = names.resolve(home, run_id, note=lambda _text: None)
    watch = Watch(run, SshOptions(), interval=1.0)
    watch.start()
    try:
        watch.wait_connected(15)
        for _ in range(3):
            frame = watch.refresh()
        assert [h.status for h in frame.hosts] == [OK, OK], frame.hosts
        faults.crash(cluster.sb, "node10")
        revive.append("node10")
        # The closed connection shows at the next refresh, the one after if the connection's
        # reader has not heard the close yet (then that refresh waits an interval).
        count, frame = refreshes_until_lost(watch, "node10")
        assert count <= 2, (count, frame.hosts)
        lost = next(r for r in frame.ranks if r.node == "node10")
        assert lost.pid is None  # nothing is claimed about a host that does not answer
        # The other host still answers (its part of the run is ended by the gang).
        assert [h.status for h in frame.hosts] == [OK, LOST], frame.hosts
        sandbox.partition(cluster.sb, "node9")
        partitioned.append("node9")
        # Only the missed answers tell: lost once two intervals have passed since its last
        # answer, seen by the third refresh at the latest (two intervals, and the refresh that
        # looks after them when the cut came within a few milliseconds of that answer).
        count, frame = refreshes_until_lost(watch, "node9")
        assert count <= 3, (count, frame.hosts)
        assert "no answer for" in frame.hosts[0].reason, frame.hosts
    finally:
        watch.close()


def test_top_draws_in_a_real_terminal(cluster: Cluster, home: Path, tmp_path: Path,
                                      ticker: Path, strays: None) -> None:
    assert shutil.which("tmux"), "tmux is needed for this test"
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    # An attached run this time: its controller streams the logs while top watches too.
    launch = start_cli("launch", "--nproc-per-node", "2", "--grace", "3", "--env",
                       "STEP_SLEEP=0.3", str(inv), str(ticker))
    assert launch.stderr is not None
    said = Reader(launch.stderr)
    said.wait_for(r"run \S+: 2 nodes")
    run_id = re.search(r"run (\S+): 2 nodes", said.text).group(1)  # type: ignore[union-attr]
    wait_lines(cluster, run_id, {"node9": [0, 1], "node10": [2, 3]})
    session = f"top-{run_id[-8:]}"
    command = " ".join([*clusterrun_argv("top", run_id, "--interval", "1")])
    env = f"CLUSTERRUN_HOME={home}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "30",
                    f"cd {Path.cwd()} && {env} {command}; sleep 30"], check=True)
    try:
        screen = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                    capture_output=True, text=True, check=True).stdout
            if re.search(r"rank 3 at", screen) and "node10" in screen:
                break
            time.sleep(0.5)
        (tmp_path / "frame.txt").write_text(screen)
        assert f"clusterrun top {run_id}" in screen, screen
        assert "LINES/MIN" in screen and "LAST LINE" in screen, screen
        # One sampler per host while it shows the run.
        assert {h: len(samplers(cluster, h)) for h in HOSTS} == dict.fromkeys(HOSTS, 1)
        for rank in range(4):
            assert re.search(rf"step \d+ rank {rank} at", screen), screen
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                    capture_output=True, text=True, check=True).stdout
            if "LINES/MIN" not in screen:
                break
            time.sleep(0.3)
        assert "LINES/MIN" not in screen, "q did not end the view"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    # Quitting top leaves the run going, and no sampler behind on the hosts.
    time.sleep(1)
    assert {h: samplers(cluster, h) for h in HOSTS} == {h: [] for h in HOSTS}
    assert launch.poll() is None, said.text
    launch.send_signal(signal.SIGINT)  # the run's own Ctrl-C ends it everywhere
    assert launch.wait(60) == 130
    assert cluster.wait_run_gone(HOSTS, run_id, 20) == {}


def check_sample(sample: dict, run_id: str, hosts: dict[str, list[int]],
                 read_log: Callable[[str, str], str]) -> None:
    """Every rank of ``hosts`` sampled, its last line one its log on its host holds."""
    assert [h["node"] for h in sample["hosts"]] == list(hosts)
    expected = sorted(r for ranks in hosts.values() for r in ranks)
    assert sorted(r["rank"] for r in sample["ranks"]) == expected
    for rank in sample["ranks"]:
        assert rank["pid"], rank
        lines = read_log(rank["node"], log_path(run_id, rank["node"], rank["rank"])).splitlines()
        assert rank["last_line"] in lines[-20:], (rank, lines[-3:])


def test_top_on_a_container_host(cluster: Cluster, podman_hosts: Containers, home: Path,
                                 tmp_path: Path, ticker: Path) -> None:
    host, name = "node30", "toptrainer"
    podman_hosts.run(host, name)
    inv = cluster.inventory(tmp_path / "inv.yaml", [host], defaults={"container": name})
    run_id = detach(inv, ticker, "STEP_SLEEP=0.3")

    def in_container(_host: str, path: str) -> str:
        return str(podman_hosts.podman(host, "exec", name, "cat", path, check=False).stdout)

    deadline = time.monotonic() + 120
    while in_container(host, log_path(run_id, host, 1)).count("\n") < 3:
        assert time.monotonic() < deadline, "the ranks in the container printed nothing"
        time.sleep(0.5)
    sample = top_once(run_id)
    check_sample(sample, run_id, {host: [0, 1]}, in_container)
    for rank in sample["ranks"]:  # the pids are the container's own
        environ = podman_hosts.podman(host, "exec", name, "cat",
                                      f"/proc/{rank['pid']}/environ").stdout
        assert f"RANK={rank['rank']}\0" in environ
    assert run_cli("stop", run_id).returncode == 0
    assert cluster.wait_run_gone([host], run_id, 30) == {}


def test_top_on_a_slurm_host(cluster: Cluster, slurm_nodes: SlurmCluster, home: Path,
                             tmp_path: Path, ticker: Path) -> None:
    node = "node26"
    inv = tmp_path / "inv.yaml"
    base = yaml.safe_load(cluster.sb.inventory.read_text())
    inv.write_text(yaml.safe_dump({"defaults": {"python": base["defaults"]["python"],
                                                "workdir": "/tmp/clusterrun"},
                                   "hosts": "slurm"}))
    me = " ".join(clusterrun_argv())
    out = tmp_path / "top.json"
    # Inside one allocation, as a user in an salloc shell: launch detached, watch, stop.
    script = (f"set -e; {me} launch --detach --nproc-per-node 2 --env STEP_SLEEP=0.3 {inv} "
              f"{ticker}; id=$({me} ps --json | python3 -c "
              "'import json,sys; print(json.load(sys.stdin)[0][\"id\"])'); "
              "for i in $(seq 60); do "
              f"{me} top $id --once --json --interval 1 > {out} || true; "
              f"grep -q '\"last_line\": \"step' {out} && break; sleep 2; done; "
              f"{me} stop $id")
    cp = subprocess.run(slurm_nodes.salloc_argv(1, [node], ["/bin/sh", "-c", script]),
                        env=slurm_nodes.env(), capture_output=True, text=True, timeout=240,
                        check=False)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    sample = json.loads(out.read_text())
    check_sample(sample, sample["run"], {node: [0, 1]}, cluster.read)
    assert cluster.wait_run_gone([node], sample["run"], 20) == {}


def test_top_shows_a_stalled_detached_run(cluster: Cluster, home: Path, tmp_path: Path,
                                          strays: None) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS)
    script = copy_payload(tmp_path, "hang.py")
    cp = run_cli("launch", "--detach", "--nproc-per-node", "1", "--grace", "2",
                 "--stall-timeout", "8", "--env", "HANG=sleep", "--env", "HANG_RANK=1",
                 str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    run_id = re.search(r"run (\S+) started on", cp.stderr).group(1)  # type: ignore[union-attr]
    # The hub (node9's supervisor) finds the stall and says so in its state there.
    state_file = f"/tmp/clusterrun/runs/{run_id}/node9/state.json"
    deadline = time.monotonic() + 120
    while json.loads(cluster.read("node9", state_file)).get("state") != "stalled":
        assert time.monotonic() < deadline, "the hub never found the stall"
        time.sleep(1)
    shown = run_cli("top", run_id, "--once", "--interval", "1", timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert f"clusterrun top {run_id}  STALLED" in shown.stdout, shown.stdout
    assert re.search(r"node9 +stalled", shown.stdout), shown.stdout
    assert run_cli("stop", run_id).returncode == 0
    assert cluster.wait_run_gone(HOSTS, run_id, 20) == {}
