"""Shared fixtures: one real namespace cluster for the whole session, a private
$CLUSTERRUN_HOME per test, and a way to run the real `clusterrun` command.

The cluster fixture fails (it never skips) when the cluster cannot be built: in CI that must be
noticed. Plain `pytest` leaves them out (the fast tier, `-m "not cluster"`, no root needed) and
says so; `-m "cluster or slow"` or a test file named alone runs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from clusterrun import sandbox, wire
from clusterrun.inventory import HostSpec, Inventory
from clusterrun.transport import shell
from clusterrun.transport.fake import FakeNetwork
from clusterrun.transport.local import LocalTransport
from tests.support import containers as sandbox_containers
from tests.support import sessions
from tests.support import slurm as sandbox_slurm

# The other-user fixtures (`other_user`, `shared`) live beside: tests/other_user.py; the clocks
# of time tests (`clock_base`): tests/clocks.py; the warm session's `session_on`:
# tests/support/session_cluster.py.
pytest_plugins = ["tests.other_user", "tests.clocks", "tests.support.session_cluster"]

REPO = Path(__file__).resolve().parent.parent
TEST_PAYLOADS = Path(__file__).resolve().parent / "payloads"
CLUSTER_SIZE = 32
FIREWALL = "clusterrun_test_firewall"  # the nftables table of Cluster.admit_only
LISTEN_HOST = "127.0.0.2"  # not "local" to clusterrun: it would be reached over SSH


@dataclass
class Cluster:
    sb: sandbox.Sandbox

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.sb.hosts]

    def host(self, name: str) -> sandbox.SandboxHost:
        return next(h for h in self.sb.hosts if h.name == name)

    def inventory(self, path: Path, names: Sequence[str], *, defaults: dict[str, Any] | None = None,
                  hosts: dict[str, dict[str, Any]] | None = None, **top: Any) -> Path:
        """An inventory for some of the cluster's hosts, in the order given."""
        base = yaml.safe_load(self.sb.inventory.read_text())
        base["defaults"].update(defaults or {})
        base.update(top)
        base["hosts"] = [{"host": self.host(n).address, "name": n, **(hosts or {}).get(n, {})}
                         for n in names]
        path.write_text(yaml.safe_dump(base, sort_keys=False))
        return path

    def pids(self, name: str) -> list[int]:
        """Every process in the host but the sandbox's own daemons (sshd, and slurmd on a host
        of its Slurm) and a live warm session's agent with the sshd session carrying it
        (tests/support/sessions.py): killing what this returns never takes a Slurm node down
        nor a session's connection."""
        found = sandbox_slurm.pids(self.sb, name)
        session = sessions.carried(found)
        return [pid for pid in found if pid not in session]

    def admit_only(self, name: str, *ports: int) -> None:
        """The host drops every new inbound connection except to ``ports``, as a host firewall
        written for SSH and the job's one port does (undo: ``admit_all``)."""
        allowed = ", ".join(str(p) for p in ports)
        rules = (f"table inet {FIREWALL} {{\n  chain input {{\n"
                 "    type filter hook input priority 0; policy drop;\n"
                 "    ct state established,related accept\n    iif lo accept\n"
                 f"    tcp dport {{ {allowed} }} accept\n  }}\n}}\n")
        subprocess.run(["ip", "netns", "exec", self.host(name).netns, "nft", "-f", "-"],
                       input=rules, text=True, check=True)

    def admit_all(self, name: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.host(name).netns, "nft", "-f", "-"],
                       input=f"table inet {FIREWALL}\ndelete table inet {FIREWALL}\n",
                       text=True, check=True)

    def run_on(self, name: str, *argv: str) -> str:
        """A command inside a host (its own /tmp), without SSH."""
        cp = sandbox.exec_in(self.sb, name, list(argv), capture_output=True, text=True,
                             timeout=60, check=True)
        return str(cp.stdout)

    def read(self, name: str, path: str) -> str:
        return self.run_on(name, "cat", path)

    def wait_gone(self, names: Sequence[str], found: Callable[[str], list[str]],
                  timeout: float, interval: float = 0.25) -> dict[str, list[str]]:
        """Poll ``found(host)`` on these hosts until it is empty on all of them; return what
        is left after ``timeout`` (empty when clean)."""
        deadline = time.monotonic() + timeout
        while True:
            left = {n: found(n) for n in names}
            left = {n: p for n, p in left.items() if p}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(interval)

    def wait_no_processes(self, names: Sequence[str], timeout: float) -> dict[str, list[str]]:
        """Wait until nothing but sshd (and the sandbox's slurmd, on a host of its Slurm)
        lives in these hosts; return what is left after ``timeout`` (empty when clean), with
        each process's command line. slurmd is left out so that a test is not decided by
        whether a Slurm test ran before it on the same hosts (test order differs by worker)."""
        return self.wait_gone(names, lambda n: [_cmdline(pid) for pid in self.pids(n)], timeout)

    def wait_run_gone(self, names: Sequence[str], run_id: str,
                      timeout: float) -> dict[str, list[str]]:
        """Wait until no process of the run (ranks, torchrun, supervisors, the engine or srun
        clients that started them) is left on these hosts, for hosts where other processes
        stay (containers, slurmd); return what is left after ``timeout``."""
        return self.wait_gone(
            names, lambda n: self.run_processes(n, run_id, supervisors=True), timeout)

    def run_processes(self, name: str, run_id: str, *, supervisors: bool = False) -> list[str]:
        """Command lines of a run's processes on a host: its torchrun and ranks (by the run id in
        their environment) and, if asked, any clusterrun supervisor (the program clusterrun
        ships on stdin; only meaningful while one run is on the host)."""
        found = []
        for pid in self.pids(name):
            with contextlib.suppress(OSError):  # it may have exited meanwhile
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if (f"CLUSTERRUN_RUN_ID={run_id}".encode() in environ
                        or (supervisors and b"<clusterrun>" in cmdline)):
                    found.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:120])
        return found

    def cmdlines_until_exit(self, proc: subprocess.Popen[str],
                            names: Sequence[str]) -> list[bytes]:
        """Every command line seen on these hosts, sampled until ``proc`` exits: where a
        secret must never show up."""
        seen: list[bytes] = []
        while proc.poll() is None:
            for name in names:
                for pid in self.pids(name):
                    with contextlib.suppress(OSError):  # it may have exited meanwhile
                        seen.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            time.sleep(0.1)
        return seen

    def kill_all(self, names: Sequence[str]) -> None:
        """Clean strays between tests, so one test's leftovers never fail another."""
        for name in names:
            for pid in self.pids(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            "utf-8", "replace").strip()
    except OSError:
        return "?"


def names_tests(config: pytest.Config) -> bool:
    """Whether the command line names a test file or a test (`tests/test_x.py`,
    `tests/test_x.py::test_y`) rather than only directories, or nothing (testpaths)."""
    here = config.invocation_params.dir
    for arg in config.args:
        path = arg.split("::", 1)[0]
        if "::" in arg or (here / path).is_file():
            return True
    return False


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--direct", action="store_true",
        help="run the cluster tests on the direct path, the warm session off "
             "(CLUSTERRUN_SESSION=0 for each test marked cluster; docs/testing.md)")


@pytest.fixture(autouse=True)
def session_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The cluster tests run as users run clusterrun: through the warm session, unless
    --direct (a test may still turn it off itself). The fast tier runs with it off: its
    stand-in hosts are reached in-process, and the session's own fast tests turn it on.
    Whatever the mode, each session daemon the test started is stopped when it ends,
    whatever $CLUSTERRUN_HOME it served, as `clusterrun session stop` does: no daemon or
    agent outlives its test."""
    if request.node.get_closest_marker("cluster") is None or request.config.getoption("direct"):
        monkeypatch.setenv("CLUSTERRUN_SESSION", "0")
    else:
        monkeypatch.setenv("CLUSTERRUN_SESSION", "1")
        # The first command too: by default it would go direct, leaving the session untested.
        monkeypatch.setenv("CLUSTERRUN_SESSION_COLD", "wait")
    yield
    sessions.stop_ours()


def cluster_left_out(config: pytest.Config) -> bool:
    """Plain `pytest` (no -m, no test file named) is the fast tier, `-m "not cluster"`: the
    cluster tests need root and build a 32-host cluster, which nobody typing `pytest` expects.
    `-m "cluster or slow"` runs them, and so does naming their file or a test."""
    return not config.getoption("markexpr") and not names_tests(config)


CLUSTER_LEFT_OUT = ('plain `pytest` runs the fast tier only: the cluster and slow tests were '
                    'left out. Run them as root with `pytest -m "cluster or slow"` '
                    '(docs/testing.md), or name their file.')


@pytest.hookimpl(trylast=True)  # after tests/reliability's hook has marked its cluster tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `slow` (real torch or training on this machine, seconds of CPU each) are
    left out by any -m expression that does not name them, so the README's fast tier,
    `-m "not cluster"`, keeps its time on two cores; the root run, `-m "cluster or slow"`,
    runs them (pyproject.toml's markers). Without -m, a test file or test named alone runs
    whatever it holds, and plain `pytest` leaves out the cluster tier (`cluster_left_out`)."""
    expr = config.getoption("markexpr") or ""
    if not expr:
        if cluster_left_out(config):
            _deselect(config, items, "cluster")
            _deselect(config, items, "slow")
        return
    if not re.search(r"\bslow\b", expr):
        _deselect(config, items, "slow")


def _deselect(config: pytest.Config, items: list[pytest.Item], marker: str) -> None:
    gone = [item for item in items if item.get_closest_marker(marker) is not None]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = [item for item in items if item.get_closest_marker(marker) is None]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    # Here rather than at collection: with -n the workers collect, and only this process prints.
    if cluster_left_out(config):
        terminalreporter.write_line(CLUSTER_LEFT_OUT)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A cluster test that skips fails instead: the cluster tier fails, never skips, so a CI
    machine that lacks something says so (a skip would pass unseen)."""
    outcome: Any = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("cluster") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} skipped ({reason}), but the cluster tier fails, never "
                           "skips: give the test what it needs, or make it fail with the cause.")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster") / "sandbox"
    sb = sandbox.up(CLUSTER_SIZE, root, decoy=True)
    try:
        yield Cluster(sb)
    finally:
        sandbox.down(root)


def slurm_inventory(cluster: Cluster, path: Path) -> Path:
    """`hosts: slurm`: the nodes of the allocation the command runs in, with the sandbox's
    Python and a workdir every node has."""
    base = yaml.safe_load(cluster.sb.inventory.read_text())
    doc = {"defaults": {"python": base["defaults"]["python"], "workdir": "/tmp/clusterrun"},
           "hosts": "slurm"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def copy_payload(tmp_path: Path, name: str, folder: str = "job") -> Path:
    """A test payload in a directory of its own: that directory is what gets synced."""
    target = tmp_path / folder / name
    target.parent.mkdir(exist_ok=True)
    target.write_text((TEST_PAYLOADS / name).read_text())
    return target


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    return copy_payload(tmp_path, "report.py")


@pytest.fixture
def spam(tmp_path: Path) -> Path:
    return copy_payload(tmp_path, "spam.py", "spam")


@pytest.fixture
def partitioned(cluster: Cluster) -> Iterator[list[str]]:
    """Hosts appended here are cut off by the test and always healed afterwards."""
    cut: list[str] = []
    try:
        yield cut
    finally:
        for name in cut:
            sandbox.heal(cluster.sb, name)


@pytest.fixture
def clean(cluster: Cluster) -> Iterator[None]:
    """Kill whatever a test left on the hosts it uses, so it cannot fail the next test."""
    yield
    cluster.kill_all(cluster.names[:4])


@dataclass
class Containers:
    """podman on the cluster's hosts (tests/support/containers.py), keeping a list of the
    containers started through run(), for removal after the test."""

    sb: sandbox.Sandbox
    started: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def run(self, host: str, name: str, **kwargs: Any) -> None:
        self.started.append((host, name))
        sandbox_containers.run(self.sb, host, name, **kwargs)

    def podman(self, host: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sandbox_containers.podman(self.sb, host, *args, check=check)

    def remove_started(self) -> None:
        while self.started:
            host, name = self.started.pop()
            sandbox_containers.remove(self.sb, host, name)


# The hosts container tests use: enabling podman gives a host its own /etc/containers and
# /dev/shm, which other tests' hosts keep as they were, whichever tests ran first.
CONTAINER_HOSTS = [f"node{k}" for k in range(27, CLUSTER_SIZE + 1)]


@pytest.fixture(scope="session")
def containers(cluster: Cluster) -> Iterator[Containers]:
    """A podman of its own on each of CONTAINER_HOSTS, all sharing one tiny image
    (sandbox_containers.IMAGE); sandbox.down removes any container left at the end."""
    sandbox_containers.enable(cluster.sb, CONTAINER_HOSTS)
    helper = Containers(cluster.sb)
    yield helper
    helper.remove_started()


@pytest.fixture
def podman_hosts(containers: Containers) -> Iterator[Containers]:
    """`containers`, with every container the test starts through it removed afterwards."""
    yield containers
    containers.remove_started()


# The hosts that are Slurm's nodes: once `slurm` has run, each runs a slurmd besides its sshd,
# which Cluster.pids leaves out, so that other tests on these hosts (test_normal_user) can kill
# their strays without taking a node down (wait for a job's end with wait_no_job_processes).
SLURM_HOSTS = [f"node{k}" for k in range(23, 27)]


@pytest.fixture(scope="session")
def slurm(cluster: Cluster) -> sandbox_slurm.SlurmCluster:
    """A real Slurm whose nodes are SLURM_HOSTS (tests/support/slurm.py): run its clients
    (salloc, srun, scancel...) with env=slurm.env(). sandbox.down ends it with the cluster."""
    return sandbox_slurm.enable(cluster.sb, SLURM_HOSTS)


@pytest.fixture
def slurm_nodes(slurm: sandbox_slurm.SlurmCluster) -> Iterator[sandbox_slurm.SlurmCluster]:
    """`slurm`, with every job the test leaves cancelled and its nodes idle again afterwards,
    so that the next test's allocation never waits for them."""
    yield slurm
    sandbox_slurm.scancel(slurm)
    sandbox_slurm.wait_idle(slurm)


def wait_no_job_processes(cluster: Cluster, names: Sequence[str],
                          timeout: float) -> dict[str, list[str]]:
    """Cluster.wait_no_processes for Slurm nodes, whose slurmd stays: wait until nothing of a
    job lives in these hosts; return what is left after ``timeout`` (empty when clean)."""
    return cluster.wait_gone(
        names, lambda n: [_cmdline(pid) for pid in sandbox_slurm.pids(cluster.sb, n)], timeout,
        interval=0.05)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $CLUSTERRUN_HOME for this test."""
    path = tmp_path / "home"
    monkeypatch.setenv("CLUSTERRUN_HOME", str(path))
    return path


def clusterrun_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "clusterrun", *args]


def run_cli(*args: str, timeout: float = 180, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real command line, as a user runs it."""
    return subprocess.run(clusterrun_argv(*args), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env={**os.environ, **(env or {})},
                          check=False)


def start_cli(*args: str, cwd: Path | None = None, **kwargs: Any) -> subprocess.Popen[str]:
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(clusterrun_argv(*args), text=True, cwd=cwd or REPO, **kwargs)


def detach_hung_in_containers(inv: Path, script: Path) -> tuple[str, list[dict[str, Any]]]:
    """`launch --detach` of tests/payloads/hang.py (2 hosts x 2 ranks, rank 2 asleep outside any
    collective) in containers; once `stacks --json` shows rank 2 asleep and the other three in
    all_reduce: the run's id and its ranks."""
    cp = run_cli("launch", "--detach", "--nproc-per-node", "2", "--grace", "2", "--env",
                 "HANG=sleep", "--env", "HANG_RANK=2", str(inv), str(script))
    assert cp.returncode == 0, cp.stderr
    match = re.search(r"run (\S+) started on", cp.stderr)
    assert match, cp.stderr
    deadline = time.monotonic() + 120
    while True:
        found = run_cli("stacks", "--json", match.group(1))
        ranks: list[dict[str, Any]] = (json.loads(found.stdout)["ranks"]
                                       if found.returncode == 0 else [])
        inner = [main[-1] for main in map(main_functions, ranks) if main]
        if len(ranks) == 4 and "sleep_outside_collectives" in inner and \
                inner.count("all_reduce") == 3:
            return match.group(1), ranks
        assert time.monotonic() < deadline, found.stdout + found.stderr
        time.sleep(2)


def main_functions(rank: dict[str, Any]) -> list[str]:
    """A `stacks --json` rank's MainThread functions, outermost first."""
    threads = [t for t in rank["threads"] if t["name"] == "MainThread"]
    return [f["function"] for f in threads[0]["frames"]] if threads else []


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP port standing in for a host nobody should connect to: a connection attempt lands
    in its backlog (``connection_attempted``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LISTEN_HOST, 0))
    sock.listen(16)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def connection_attempted(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


# --- The fast tier: no root, no sshd. The in-memory transport the package ships for tests
# (clusterrun/transport/fake.py), and the real command line run in this process on top of it.


def host_spec(host: str, name: str | None = None, *, master: bool = False,
              **settings: Any) -> HostSpec:
    return HostSpec(host, name or host, master=master, line=1, **settings)


def fake_inventory(tmp_path: Path, *specs: HostSpec, **top: Any) -> Inventory:
    hosts = specs if any(s.master for s in specs) else (
        dataclasses.replace(specs[0], master=True), *specs[1:])
    return Inventory(tmp_path / "inventory.yaml", tuple(hosts), **top)


def write_inventory(path: Path, hosts: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(yaml.safe_dump({**top, "hosts": hosts}, sort_keys=False))
    return path


@pytest.fixture
def fake_net(monkeypatch: pytest.MonkeyPatch) -> FakeNetwork:
    """A fake network that every command in this process connects through."""
    network = FakeNetwork()
    monkeypatch.setattr("clusterrun.transport.pool.connect_host", network.connect)
    return network


@pytest.fixture
def quick_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preflight's per-host deadlines cut to fractions of a second, for hosts that never
    answer."""
    monkeypatch.setattr("clusterrun.preflight.checks.PROBE_SECONDS", 0.5)
    monkeypatch.setattr("clusterrun.preflight.checks.CONNECT_SECONDS", 0.5)


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`clusterrun ARGS` in this process: (exit status, stdout, stderr)."""
    from clusterrun.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 1), out, err


class Reader:
    """Collects a process's output lines as they arrive, with their arrival times."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            if sum(1 for _, line in self.lines if regex.search(line)) >= count:
                return
            time.sleep(0.1)
        raise AssertionError(f"{count} x {pattern!r} not seen; got:\n" + self.text[-3000:])

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def join(self) -> None:
        self._thread.join(10)


# --- The supervisor's programs (clusterrun/remote/) run as the controller runs them, through the
# local transport: no root, no sshd. Processes a test starts carry CLUSTERRUN_TEST_MARK.


LOCAL_SPEC = HostSpec(host="localhost", name="n0", master=True, line=0, python=sys.executable)


def marked(mark: str) -> list[int]:
    """Live processes (not zombies) carrying this test's marker in their environment."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        zombie = stat.rsplit(")", 1)[1].split()[0] == "Z"
        if f"CLUSTERRUN_TEST_MARK={mark}".encode() in environ and not zombie:
            found.append(int(entry))
    return found


def wait_gone(mark: str, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


class Remote:
    """One remote program started as the controller starts it, its frames collected."""

    def __init__(self, program: str, request: dict[str, Any]) -> None:
        self.proc = LocalTransport(LOCAL_SPEC).run(shell.remote_python(LOCAL_SPEC))
        self.events: list[wire.Event] = []
        self.data: dict[str, bytes] = {}
        self.ended = threading.Event()
        self.proc.write(shell.program_input(program, request))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for header, data in wire.frames(self.proc):
            if data is not None:
                self.data[header["f"]] = self.data.get(header["f"], b"") + data
                continue
            event = wire.parse(header)
            self.events.append(event)
            if isinstance(event, wire.End):
                self.ended.set()
        self.ended.set()

    def send(self, **op: Any) -> None:
        self.proc.write(json.dumps(op).encode() + b"\n")

    def wait_for(self, kind: type, timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events if isinstance(e, kind)]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no {kind.__name__} within {timeout} s: {self.events}")

    def end(self, timeout: float = 20) -> wire.End:
        assert self.ended.wait(timeout), self.events
        ends = [e for e in self.events if isinstance(e, wire.End)]
        assert ends, self.events
        return ends[0]


def state_of(req: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads((Path(req["rundir"]) / "state.json").read_text()))


@pytest.fixture
def mark() -> Iterator[str]:
    """A marker for this test's processes (CLUSTERRUN_TEST_MARK in their environment)."""
    value = uuid.uuid4().hex
    yield value
    for pid in marked(value):  # never leave a stray behind, even when a test fails
        with contextlib.suppress(ProcessLookupError):  # it exited since it was listed
            os.kill(pid, signal.SIGKILL)
