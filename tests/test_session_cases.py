"""The warm session's hard cases on the namespace cluster (CLUSTERRUN_SESSION=1), each judged
by what is left on the hosts: a daemon SIGKILLed while it carries an attached and a detached
run, a host's sshd restarted (as `systemctl restart` does, and every sshd process killed, as a
reboot does), another Unix user on the same controller, an inventory naming another identity
or user, and the daemon's idle expiry."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterrun.sandbox import cluster as sandbox_cluster
from clusterrun.sandbox import logins, net, sshd
from clusterrun.session import paths
from tests.conftest import Cluster, copy_payload, main_functions, run_cli
from tests.other_user import OtherUser
from tests.support import faults, users
from tests.support.session_cluster import agents, ok, session_status, start_attached

pytestmark = pytest.mark.cluster

# Clear of the other session tests (node8-15), of Slurm's nodes and of the container hosts.
HOSTS = [f"node{k}" for k in range(16, 23)]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def detach(inv: Path, payload: Path, *env: str) -> str:
    args = [x for e in env for x in ("--env", e)]
    cp = run_cli("launch", "--detach", "--nproc-per-node", "1", "--grace", "3", *args,
                 str(inv), str(payload))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    match = re.search(r"run (\S+) started on", cp.stderr)
    assert match, cp.stderr
    return match.group(1)


def run_pids(cluster: Cluster, name: str, run_id: str) -> set[int]:
    """The run's torchrun and ranks on a host (its id in their environment; not a helper
    they start for a moment)."""
    found = set()
    for pid in cluster.pids(name):
        with contextlib.suppress(OSError):
            if f"CLUSTERRUN_RUN_ID={run_id}".encode() in \
                    Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") and \
                    re.search(rb"torch\.distributed\.run|\.py\0",
                              Path(f"/proc/{pid}/cmdline").read_bytes()):
                found.add(pid)
    return found


def wait_ranks(cluster: Cluster, names: list[str], run_id: str) -> dict[str, set[int]]:
    """Until each host runs the run's torchrun and its one rank; their pids."""
    deadline = time.monotonic() + 90
    while True:
        found = {n: run_pids(cluster, n, run_id) for n in names}
        if all(len(pids) >= 2 for pids in found.values()):
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.5)


def test_a_killed_daemon_ends_its_attached_run_and_not_a_detached_one(
        cluster: Cluster, tmp_path: Path, session_on: None) -> None:
    attached, detached = HOSTS[:2], HOSTS[2:4]
    run_id = detach(cluster.inventory(tmp_path / "detached.yaml", detached),
                    copy_payload(tmp_path, "report.py", "detached"), "SLEEP=600")
    ranks = wait_ranks(cluster, detached, run_id)
    proc, _ = start_attached(cluster, tmp_path, attached)
    daemon = session_status()["pid"]
    assert set(agents()) == set(attached + detached)
    os.kill(daemon, signal.SIGKILL)
    # The attached run's lifeline was the daemon's connection: nothing of it stays, nor of
    # the agents and their sshd sessions.
    assert cluster.wait_no_processes(attached, 15) == {}
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    if proc.poll() is None:
        proc.kill()
    # The detached run is in sessions of its own: it goes on, only the agents went.
    assert all(alive(pid) for pids in ranks.values() for pid in pids), ranks
    ps = run_cli("ps", "--json")  # a new command, so a new daemon
    assert ps.returncode == 0, ps.stderr
    assert {r["id"]: r for r in json.loads(ps.stdout)}[run_id]["state"] == "running"
    assert session_status()["pid"] != daemon
    logs = run_cli("logs", run_id)
    assert logs.returncode == 0, logs.stderr
    for rank, name in enumerate(detached):
        assert f"report rank {rank} on {name}" in logs.stdout, logs.stdout
    stop = run_cli("stop", run_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert cluster.wait_no_processes(detached, 20) == {}  # the new daemon's agents left out
    ps = run_cli("ps", "--json")
    assert {r["id"]: r for r in json.loads(ps.stdout)}[run_id]["state"] == "stopped", ps.stdout


def sshd_processes(cluster: Cluster, name: str) -> list[int]:
    """Every sshd process of the host: its listener and one or more per connection."""
    found = []
    for pid in net.netns_pids(cluster.host(name).netns):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().startswith("sshd"):
                found.append(pid)
    return found


def restart_sshd(cluster: Cluster, name: str, *, every_process: bool) -> None:
    """`systemctl restart ssh`: SIGTERM to the listener alone (ssh.service's KillMode=process
    keeps the sessions), then a new listener. ``every_process``: all of the host's sshd
    processes SIGKILLed first, as a reboot ends them, sessions included."""
    host = cluster.host(name)
    doomed = sshd_processes(cluster, name) if every_process else [host.sshd_pid]
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL if every_process else signal.SIGTERM)
    deadline = time.monotonic() + 10
    while set(doomed) & set(net.netns_pids(host.netns)):
        assert time.monotonic() < deadline, "sshd did not exit"
        time.sleep(0.05)
    sshd.reap_children({host.netns})
    root = cluster.sb.root
    state = sandbox_cluster.read_state(root)
    proc = sshd.start(root, state.view, state.host(name), sshd.shared_under_tmp(state.python))
    state.set_pids(sshd.wait_ready(root, [state.host(name)], {name: proc}))
    sandbox_cluster.write_state(root, state)
    cluster.sb = sandbox_cluster.load(root)


@pytest.fixture
def listening(cluster: Cluster) -> Iterator[list[str]]:
    """Hosts appended here get a listening sshd again afterwards, whatever the test did."""
    touched: list[str] = []
    yield touched
    for name in touched:
        if cluster.host(name).sshd_pid not in net.netns_pids(cluster.host(name).netns):
            cluster.sb = faults.revive(cluster.sb.root, name)


@pytest.mark.parametrize("every_process", [False, True], ids=["restart", "reboot"])
def test_an_sshd_restarted_between_two_commands(cluster: Cluster, tmp_path: Path,
                                                session_on: None,
                                                listening: list[str],
                                                every_process: bool) -> None:
    names = HOSTS[4:6]
    victim = names[0]
    inv = str(cluster.inventory(tmp_path / "inv.yaml", names))
    ok("exec", inv, "--", "true")()
    held = agents()
    listening.append(victim)
    restart_sshd(cluster, victim, every_process=every_process)
    if every_process:  # its session gone, the agent saw EOF and exited
        deadline = time.monotonic() + 10
        while alive(held[victim]):
            assert time.monotonic() < deadline, "the agent outlived its sshd session"
            time.sleep(0.05)
    before = logins(cluster.sb, victim)
    cp = run_cli("exec", inv, "--", "hostname")
    made = logins(cluster.sb, victim) - before
    direct = run_cli("exec", "--no-session", inv, "--", "hostname")
    assert cp.returncode == direct.returncode == 0, cp.stderr + direct.stderr
    # Nothing more said (each host's line comes as it ends, in either order).
    assert sorted(cp.stdout.splitlines()) == sorted(direct.stdout.splitlines()), cp.stdout
    assert cp.stderr == direct.stderr
    now = agents()
    assert now[names[1]] == held[names[1]]
    if every_process:  # a new agent, over a new login
        assert now[victim] != held[victim] and alive(now[victim])
        assert made == 2  # the new agent's, then exec's command's own
    else:  # the restart kept the agent's session, as it keeps anyone's
        assert now[victim] == held[victim]
        assert made == 1


def test_idle_expiry_leaves_nothing_on_the_hosts(cluster: Cluster, tmp_path: Path,
                                                 session_on: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`session --json` polled meanwhile is no use: it does not keep the daemon."""
    monkeypatch.setenv("CLUSTERRUN_SESSION_IDLE", "3")
    names = HOSTS[:4]
    inv = str(cluster.inventory(tmp_path / "inv.yaml", names))
    ok("exec", inv, "--", "true")()
    status = session_status()
    assert status["idle_limit"] == 3 and {h["name"] for h in status["hosts"]} == set(names)
    held = [h["agent_pid"] for h in status["hosts"]]
    deadline = time.monotonic() + 3 + 20
    while session_status()["running"]:
        assert time.monotonic() < deadline, "the daemon outlived its idle time"
        time.sleep(0.5)
    while alive(status["pid"]):  # it stops listening first, then closes its connections
        assert time.monotonic() < deadline + 10, "the daemon stopped listening, not running"
        time.sleep(0.1)
    assert "idle for 3 s" in (paths.log_path()).read_text()
    # No agent, no sshd session of it, on any host.
    assert cluster.wait_no_processes(names, 10) == {}
    assert not any(alive(pid) for pid in held)


@contextlib.contextmanager
def authorized(cluster: Cluster, key: Path) -> Iterator[None]:
    """The sandbox's hosts accept ``key`` (a second identity for the same users)."""
    path = cluster.sb.root / "authorized_keys"
    before = path.read_text()
    sshd.write_private(path, before.rstrip("\n") + "\n" + key.with_suffix(".pub").read_text())
    try:
        yield
    finally:
        sshd.write_private(path, before)


def fingerprint(key: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(key.with_suffix(".pub"))],
                         capture_output=True, text=True, check=True).stdout
    return out.split()[1]


@pytest.fixture
def second_user(cluster: Cluster) -> Iterator[str]:
    name = users.add(cluster.sb)
    yield name
    cluster.kill_all(HOSTS)  # its processes on the hosts, before its account goes
    uid = pwd.getpwnam(name).pw_uid
    for entry in os.listdir("/proc"):  # its daemon, and its agents (the hosts share the pids)
        with contextlib.suppress(OSError):
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                os.kill(int(entry), signal.SIGKILL)
    users.remove(name)


def test_another_identity_or_user_never_reuses_the_connection(
        cluster: Cluster, tmp_path: Path, session_on: None,
        shared_python: str, second_user: str) -> None:
    name = HOSTS[6]
    key = tmp_path / "id_other"
    sshd.keygen(key, "clusterrun-second-identity")
    first = str(cluster.inventory(tmp_path / "first.yaml", [name]))
    other_key = str(cluster.inventory(tmp_path / "key.yaml", [name],
                                      defaults={"identity_file": str(key)}))
    other_user = str(cluster.inventory(tmp_path / "user.yaml", [name], defaults={
        "user": second_user, "python": shared_python, "workdir": "/var/tmp"}))
    log = cluster.sb.root / name / "sshd.log"
    with authorized(cluster, key):
        ok("exec", first, "--", "true")()
        held = agents()[name]
        seen = len(log.read_text())
        before = logins(cluster.sb, name)
        cp = run_cli("exec", other_key, "--", "true")
        assert cp.returncode == 0, cp.stderr
        assert logins(cluster.sb, name) - before == 2  # a new agent's login, then exec's
        assert re.search(rf"Accepted publickey for root .* {re.escape(fingerprint(key))}",
                         log.read_text()[seen:]), log.read_text()[seen:]
        cp = run_cli("exec", other_user, "--", "id", "-un")
        assert cp.returncode == 0, cp.stderr
        assert cp.stdout.strip() == f"{name}: {second_user}", cp.stdout
        hosts = [h for h in session_status()["hosts"] if h["name"] == name]
        pids = [h["agent_pid"] for h in hosts]
        assert len(set(pids)) == 3 and held in pids and all(h["alive"] for h in hosts), hosts
        owners = {pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name for pid in pids}
        assert owners == {"root", second_user}
        before = logins(cluster.sb, name)
        ok("exec", first, "--", "true")()  # the first inventory's connection is still there
        assert logins(cluster.sb, name) - before == 1
        assert [h["agent_pid"] for h in session_status()["hosts"] if h["name"] == name] == pids


def test_another_unix_user_gets_nothing_from_the_daemon(  # noqa: PLR0917
        cluster: Cluster, tmp_path: Path, shared: Path, session_on: None,
        shared_python: str, second_user: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """User B, on the same controller, while user A's daemon holds the same hosts: B cannot
    reach A's socket, sees none of A's hosts, and gets a daemon and agents of its own; A's
    daemon goes on as it was."""
    # A's home where B may look: the session's own folder is what keeps B out. (`shared`
    # comes before `session_on`: it goes after session_on's `session` commands, which would
    # make the folder again.)
    monkeypatch.setenv("CLUSTERRUN_HOME", str(shared / "a"))
    names = HOSTS[4:6]
    inv_a = str(cluster.inventory(tmp_path / "inv.yaml", names))
    ok("exec", inv_a, "--", "true")()
    a_status = session_status()
    user = pwd.getpwnam(second_user)
    b = OtherUser(second_user, shared_python, (
        "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"))
    home = Path(user.pw_dir)
    # B's own key and known_hosts, in B's home: B logs in to the hosts as B.
    ssh = home / ".ssh"
    sshd.keygen(ssh / "id_ed25519", f"{second_user}@controller")
    with open(ssh / "authorized_keys", "a") as keys:
        keys.write((ssh / "id_ed25519.pub").read_text())
    (ssh / "known_hosts").write_text(cluster.sb.known_hosts.read_text())
    for path in (ssh / "id_ed25519", ssh / "id_ed25519.pub", ssh / "known_hosts"):
        os.chown(path, user.pw_uid, user.pw_gid)
    inv_b = cluster.inventory(shared / "inv.yaml", names, defaults={
        "user": second_user, "identity_file": str(ssh / "id_ed25519"),
        "known_hosts": str(ssh / "known_hosts"), "python": shared_python,
        "workdir": "/var/tmp"})
    inv_b.chmod(0o644)
    env = {"CLUSTERRUN_HOME": str(home / ".clusterrun"), "CLUSTERRUN_SESSION": "1"}

    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept OSError as exc:\n"
             "    print(type(exc).__name__)\nelse:\n    print('connected')\n")
    said = subprocess.run([*b.prefix, shared_python, "-S", "-c", probe,
                           str(paths.socket_path())], capture_output=True, text=True,
                          timeout=30, check=False, cwd="/")
    assert said.stdout.strip() == "PermissionError", said.stdout + said.stderr

    cp = b.run("session", "--json", home=str(home), env=env)
    assert cp.returncode == 0 and json.loads(cp.stdout)["running"] is False, cp.stdout + cp.stderr
    cp = b.run("exec", str(inv_b), "--", "id", "-un", home=str(home), env=env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert sorted(cp.stdout.splitlines()) == [f"{n}: {second_user}" for n in names], cp.stdout
    cp = b.run("session", "--json", home=str(home), env=env)
    b_status = json.loads(cp.stdout)
    try:
        assert b_status["running"] and b_status["pid"] != a_status["pid"], b_status
        assert os.stat(f"/proc/{b_status['pid']}").st_uid == user.pw_uid
        b_agents = {h["name"]: h["agent_pid"] for h in b_status["hosts"]}
        assert set(b_agents) == set(names)
        assert not set(b_agents.values()) & {h["agent_pid"] for h in a_status["hosts"]}
        assert {os.stat(f"/proc/{p}").st_uid for p in b_agents.values()} == {user.pw_uid}
        assert session_status()["pid"] == a_status["pid"]  # A's daemon, as it was
        assert agents() == {h["name"]: h["agent_pid"] for h in a_status["hosts"]}
    finally:
        b.run("session", "stop", home=str(home), env=env, timeout=30)
        if b_status.get("pid"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(b_status["pid"], signal.SIGKILL)
        run_cli("session", "stop", timeout=30)  # A's, before `shared` (its home) goes


def test_stacks_top_and_logs_follow_of_a_detached_run_as_without_the_session(
        cluster: Cluster, tmp_path: Path, session_on: None) -> None:
    names = HOSTS[2:4]
    run_id = detach(cluster.inventory(tmp_path / "inv.yaml", names),
                    copy_payload(tmp_path, "report.py"), "SLEEP=30")
    wait_ranks(cluster, names, run_id)
    ok("exec", str(tmp_path / "inv.yaml"), "--", "true")()  # the agents up: warm from here
    seen = {}
    for how in ("--session", "--no-session"):
        flag = [] if how == "--session" else [how]
        before = {n: logins(cluster.sb, n) for n in names}
        stacks = run_cli("stacks", "--json", *flag, run_id)
        assert stacks.returncode == 0, stacks.stdout + stacks.stderr
        top = run_cli("top", run_id, "--once", "--json", "--interval", "1", *flag)
        assert top.returncode == 0, top.stdout + top.stderr
        made = {n: logins(cluster.sb, n) - before[n] for n in names}
        sample = json.loads(top.stdout)
        seen[how] = (
            [(r["node"], r["rank"], main_functions(r)) for r in json.loads(stacks.stdout)["ranks"]],
            sample["ok"], [(r["node"], r["rank"], r["pid"]) for r in sample["ranks"]],
            made == dict.fromkeys(names, 0))
    assert seen["--session"][:3] == seen["--no-session"][:3], seen
    assert seen["--session"][3], "a warm stacks or top logged in"
    assert not seen["--no-session"][3]
    # Followed live through the session to the run's end, it shows what the run's logs hold
    # (read with the session off once it ended).
    follow = run_cli("logs", "-f", run_id)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert f"run {run_id} succeeded" in follow.stderr, follow.stderr
    after = run_cli("logs", "--no-session", run_id)
    assert after.returncode == 0, after.stderr
    assert sorted(follow.stdout.splitlines()) == sorted(after.stdout.splitlines()), \
        (follow.stdout, after.stdout)
    assert "[node19 r1] rank 1 done" in follow.stdout, follow.stdout
