"""`clusterrun check` against the namespace cluster (issue #2).

Every assertion is about what really happened: what the CLI printed and returned, which
interface each host really has, the sshd logs, the bytes of known_hosts, files on the hosts.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterrun import sandbox
from tests.conftest import Cluster, clusterrun_argv, run_cli

pytestmark = pytest.mark.cluster

HOSTS4 = ["node1", "node2", "node3", "node4"]
NICS4 = {"node1": "eth0", "node2": "ens5", "node3": "enp3s0", "node4": "eno1"}
REPORT_KEYS = {"ok", "master_addr", "master_port", "hosts", "pairs"}
HOST_KEYS = {"host", "name", "node_rank", "ok", "interface", "address", "python", "torch", "gpus",
             "checks"}
CHECK_KEYS = {"name", "ok", "warning", "detail"}


Completed = subprocess.CompletedProcess


def check_json(inv: Path, *args: str, timeout: float = 120) -> tuple[Completed[str],
                                                                     dict[str, Any]]:
    cp = run_cli("check", "--json", *args, str(inv), timeout=timeout)
    assert "Traceback" not in cp.stderr, cp.stderr
    return cp, json.loads(cp.stdout)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in report["hosts"]}


def checks(host: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in host["checks"]}


def fingerprint(pubkey: Path) -> str:
    """What OpenSSH itself says the key's SHA256 fingerprint is."""
    out = subprocess.run(["ssh-keygen", "-lf", str(pubkey)], capture_output=True, text=True,
                         check=True).stdout
    return out.split()[1]


def host_key(cluster: Cluster, name: str, suffix: str = "") -> Path:
    return cluster.sb.root / name / f"ssh_host_ed25519_key{suffix}.pub"


def private_known_hosts(cluster: Cluster, tmp_path: Path, drop: tuple[str, ...] = ()) -> Path:
    """A copy of the cluster's known_hosts, without the lines of the hosts in ``drop``."""
    skip = {cluster.host(n).address for n in drop}
    lines = cluster.sb.known_hosts.read_text().splitlines(keepends=True)
    path = tmp_path / "known_hosts"
    path.write_text("".join(line for line in lines if line.split()[0] not in skip))
    return path


def sshd_log(cluster: Cluster, name: str) -> Path:
    return cluster.sb.root / name / "sshd.log"


def start_in(cluster: Cluster, name: str, argv: list[str]) -> subprocess.Popen[str]:
    """A long-running process inside a host (its network, hostname and mounts)."""
    pid = cluster.host(name).sshd_pid
    return subprocess.Popen(["nsenter", "-t", str(pid), "-m", "-u", "-n", "--", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ------------------------------------------------------------------ check: all pass


def test_four_decoy_hosts_each_report_their_own_nic(cluster: Cluster, tmp_path: Path) -> None:
    assert cluster.sb.decoy
    assert [cluster.host(n).ifname for n in HOSTS4] == [NICS4[n] for n in HOSTS4]
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS4)
    cp, report = check_json(inv)
    assert cp.returncode == 0, cp.stdout + cp.stderr

    assert set(report) == REPORT_KEYS
    assert report["ok"] is True
    master = cluster.host("node1")
    assert report["master_addr"] == master.address
    assert isinstance(report["master_port"], int)
    assert 1 <= report["master_port"] <= 65535
    assert [h["name"] for h in report["hosts"]] == HOSTS4
    assert [h["node_rank"] for h in report["hosts"]] == [0, 1, 2, 3]
    torch_version = metadata.version("torch")  # the hosts run this very interpreter
    python_version = ".".join(map(str, sys.version_info[:3]))
    for host in report["hosts"]:
        name = host["name"]
        assert set(host) == HOST_KEYS
        assert all(set(c) == CHECK_KEYS for c in host["checks"])
        assert all(c["ok"] for c in host["checks"]), host["checks"]
        assert host["ok"] is True
        assert host["host"] == cluster.host(name).address
        # The host's own NIC, never lo or the decoy virbr0 (which has an address too).
        assert host["interface"] == NICS4[name], host
        assert host["address"] == cluster.host(name).address
        assert host["python"] == python_version
        assert host["torch"] == torch_version
        assert host["gpus"] == 0
        names = set(checks(host))
        assert {"ssh", "python", "torch", "workdir", "dns", "gpus", "interface"} <= names
        assert checks(host)["ssh"]["detail"] == (
            f"connected to {cluster.host(name).address}, hostname {name}")
        assert checks(host)["dns"]["detail"] == f"{name} -> {cluster.host(name).address}"
        if name == "node1":
            assert "master_port" in names
            assert "data_path" not in names
        else:
            detail = checks(host)["data_path"]["detail"]
            assert f"{master.address}:{report['master_port']}" in detail
            assert f"from {NICS4[name]} ({cluster.host(name).address})" in detail
    assert {h["interface"] for h in report["hosts"]}.isdisjoint({"lo", "virbr0", "virbr0-nic"})

    # Without --json and without a terminal: one plain line per host, then the verdict.
    cp = run_cli("check", str(inv))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    lines = cp.stdout.splitlines()
    for rank, name in enumerate(HOSTS4):
        line = next(line for line in lines if line.startswith(f"{name} "))
        assert re.search(rf"rank {rank}\s+ok\s+interface {NICS4[name]} "
                         rf"{re.escape(cluster.host(name).address)}\b", line), line
    assert lines[-1].startswith(f"4/4 hosts ready; master {master.address}:")
    assert "\x1b[" not in cp.stdout  # no color codes in a pipe


def test_explicit_master_is_rank_zero_and_reports_the_nic_holding_master_addr(
        cluster: Cluster, tmp_path: Path) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS4, hosts={"node3": {"master": True}})
    cp, report = check_json(inv)
    assert cp.returncode == 0, cp.stdout
    assert [(h["name"], h["node_rank"]) for h in report["hosts"]] == [
        ("node3", 0), ("node1", 1), ("node2", 2), ("node4", 3)]
    assert report["master_addr"] == cluster.host("node3").address
    # On the master the route to its own address is `lo`: the answer is the NIC holding it.
    assert {h["name"]: h["interface"] for h in report["hosts"]} == NICS4
    assert "holds" in checks(report["hosts"][0])["interface"]["detail"]


def test_table_on_a_terminal(cluster: Cluster, tmp_path: Path) -> None:
    # node3's setup fails after printing text that looks like rich markup: it must show as is.
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2", "node3"], hosts={
        "node3": {"setup": "echo '[notice] [bold]pip is old[/bold]' >&2; false"}})
    leader, follower = pty.openpty()
    proc = subprocess.Popen(clusterrun_argv("check", str(inv)), stdout=follower,
                            stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120"})
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(30) == 3
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.decode())
    header = next(line for line in text.splitlines() if "interface" in line)
    assert re.search(r"node\s*[┃│|]\s*rank", header), text
    for name in ("node1", "node2"):
        row = next(line for line in text.splitlines() if f" {name} " in line)
        assert NICS4[name] in row
        assert cluster.host(name).address in row
        assert " ok " in row
    row = next(line for line in text.splitlines() if " node3 " in line)
    assert " FAIL " in row  # reached over SSH: not "UNREACHABLE"
    assert "[notice] [bold]pip is old[/bold]" in text
    assert "`setup:` snippet failed" in text
    assert "1 of 3 hosts failed: node3" in text


def test_master_addr_on_a_second_network(tmp_path: Path) -> None:
    """Every host also has a NIC on another network; master_addr there picks those NICs."""
    root = tmp_path / "sb2"
    sb = sandbox.up(3, root, decoy=True)
    try:
        second = sandbox.add_network(sb)
        sb = sandbox.load(root)
        nics = {nic.host: nic for nic in sb.networks[0].nics}
        doc = yaml.safe_load(sb.inventory.read_text())
        doc["master_addr"] = second["node1"]
        inv = tmp_path / "inv.yaml"
        inv.write_text(yaml.safe_dump(doc))
        cp, report = check_json(inv)
        assert cp.returncode == 0, cp.stdout
        assert report["master_addr"] == second["node1"]
        hosts = by_name(report)
        for host in sb.hosts:
            got = hosts[host.name]
            assert got["interface"] == nics[host.name].ifname != host.ifname, got
            assert got["address"] == second[host.name]
            if host.name != "node1":
                assert f"{second['node1']}:{report['master_port']}" in \
                    checks(got)["data_path"]["detail"]

        # The same hosts with master_addr auto stay on the first network...
        doc.pop("master_addr")
        inv.write_text(yaml.safe_dump(doc))
        cp, report = check_json(inv)
        assert cp.returncode == 0, cp.stdout
        assert {h["name"]: h["interface"] for h in report["hosts"]} == {
            h.name: h.ifname for h in sb.hosts}

        # ...unless the master's interface is set: auto is then its address on that interface.
        doc["hosts"][0]["interface"] = nics["node1"].ifname
        inv.write_text(yaml.safe_dump(doc))
        cp, report = check_json(inv)
        assert cp.returncode == 0, cp.stdout
        assert report["master_addr"] == second["node1"]
        assert {h["name"]: h["interface"] for h in report["hosts"]} == {
            n: nic.ifname for n, nic in nics.items()}
    finally:
        sandbox.down(root)


# ------------------------------------------------------------------ check: failures


def test_cut_off_host_is_named_within_the_connect_timeout(
        cluster: Cluster, tmp_path: Path, partitioned: list[str]) -> None:
    names = [f"node{k}" for k in range(1, 9)]
    inv = cluster.inventory(tmp_path / "inv.yaml", names)
    sandbox.partition(cluster.sb, "node6")
    partitioned.append("node6")
    start = time.monotonic()
    cp = run_cli("check", "--connect-timeout", "3", str(inv), timeout=60)
    elapsed = time.monotonic() - start
    assert cp.returncode == 4, cp.stdout + cp.stderr
    assert 3 <= elapsed < 8, elapsed
    lines = cp.stdout.splitlines()
    cut = next(i for i, line in enumerate(lines) if line.startswith("node6 "))
    assert "UNREACHABLE" in lines[cut]
    [problem] = [line for line in lines if line.startswith("  node6: ")]
    assert "no SSH answer within 3 s (connect timeout)" in problem
    for name in names:
        if name != "node6":  # every other host was still checked, in full
            assert re.search(rf"^{name} .*\bok\b.*interface {cluster.host(name).ifname} ",
                             cp.stdout, re.M), cp.stdout
    assert lines[-1].startswith("1 of 8 hosts failed: node6;")


def test_cut_off_master_fails_fast_and_workers_do_not_wait(
        cluster: Cluster, tmp_path: Path, partitioned: list[str]) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node5", "node6", "node7"])
    sandbox.partition(cluster.sb, "node5")
    partitioned.append("node5")
    start = time.monotonic()
    cp, report = check_json(inv, "--connect-timeout", "2", timeout=60)
    assert time.monotonic() - start < 7
    assert cp.returncode == 4
    hosts = by_name(report)
    assert hosts["node5"]["ok"] is False
    assert "no SSH answer within 2 s" in checks(hosts["node5"])["ssh"]["detail"]
    for name in ("node6", "node7"):
        assert checks(hosts[name])["ssh"]["ok"] is True
        assert checks(hosts[name])["interface"]["ok"] is False
    assert report["master_addr"] is None


def test_changed_host_key_is_refused_and_nothing_runs(cluster: Cluster, tmp_path: Path) -> None:
    names = ["node1", "node2", "node3"]
    known = private_known_hosts(cluster, tmp_path)
    before = known.read_bytes()
    inv = cluster.inventory(tmp_path / "inv.yaml", names, defaults={"known_hosts": str(known)})
    log = sshd_log(cluster, "node2")
    marker = f"/tmp/ran-{os.getpid()}-{time.time_ns()}"
    sandbox.regenerate_host_key(cluster.sb, "node2")
    try:
        new = fingerprint(host_key(cluster, "node2"))
        old = fingerprint(host_key(cluster, "node2", ".orig"))
        assert new != old
        offset = log.stat().st_size
        for accept in ([], ["--accept-new-host-keys"]):  # a changed key is *always* refused
            cp = run_cli("check", "--connect-timeout", "5", *accept, str(inv), timeout=60)
            assert cp.returncode == 4, cp.stdout + cp.stderr
            problem = next(line for line in cp.stdout.splitlines() if "CHANGED" in line)
            assert "node2" in problem
            assert f"presented ssh-ed25519 {new}" in problem
            assert f"{known} has ssh-ed25519 {old}" in problem
            assert f"ssh-keygen -R {cluster.host('node2').address}" in problem
            assert re.search(r"^node1 .*\bok\b", cp.stdout, re.M)
            assert known.read_bytes() == before
        cp = run_cli("exec", "--connect-timeout", "5", str(inv), "--", f"touch {marker}",
                     timeout=60)
        assert cp.returncode == 4
        assert re.search(r"^unreachable: node2: host key: .*CHANGED", cp.stderr, re.M), cp.stderr
        assert known.read_bytes() == before
        # The connections reached node2's sshd, and none was ever authenticated.
        attempts = log.read_bytes()[offset:].decode(errors="replace")
        assert re.search(r"Connection (closed|reset) by", attempts), attempts
        assert "Accepted publickey" not in attempts
        assert cluster.run_on("node2", "sh", "-c", f"ls {marker} 2>/dev/null || true") == ""
        assert cluster.run_on("node1", "ls", marker).strip() == marker  # the others ran it
    finally:
        sandbox.restore_host_key(cluster.sb, "node2")
        for name in names:
            cluster.run_on(name, "rm", "-f", marker)


def test_key_of_another_type_counts_as_changed(cluster: Cluster, tmp_path: Path) -> None:
    """known_hosts knows the host by an ECDSA key the server no longer has: accept-new must not
    quietly add the server's ed25519 key next to it."""
    known = private_known_hosts(cluster, tmp_path, drop=("node3",))
    keyfile = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(keyfile)], check=True)
    algo, blob = keyfile.with_suffix(".pub").read_text().split()[:2]
    with known.open("a") as fh:
        fh.write(f"{cluster.host('node3').address} {algo} {blob}\n")
    before = known.read_bytes()
    inv = cluster.inventory(tmp_path / "inv.yaml", ["node3"], defaults={"known_hosts": str(known)})
    cp = run_cli("check", "--accept-new-host-keys", "--connect-timeout", "5", str(inv))
    assert cp.returncode == 4, cp.stdout
    assert "CHANGED" in cp.stdout
    assert fingerprint(host_key(cluster, "node3")) in cp.stdout
    assert fingerprint(keyfile.with_suffix(".pub")) in cp.stdout
    assert known.read_bytes() == before


def test_unknown_host_key_needs_accept_new(cluster: Cluster, tmp_path: Path) -> None:
    names = ["node1", "node2", "node3"]
    known = private_known_hosts(cluster, tmp_path, drop=("node2",))
    known.chmod(0o640)
    before = known.read_bytes()
    inv = cluster.inventory(tmp_path / "inv.yaml", names, defaults={"known_hosts": str(known)})
    address = cluster.host("node2").address
    fp = fingerprint(host_key(cluster, "node2"))

    cp = run_cli("check", "--connect-timeout", "5", str(inv))
    assert cp.returncode == 4, cp.stdout
    problem = next(line for line in cp.stdout.splitlines() if "is not in" in line)
    assert f"node2: the host key of {address} is not in {known} (ssh-ed25519 {fp})" in problem
    assert "--accept-new-host-keys" in problem
    assert known.read_bytes() == before

    cp = run_cli("check", "--accept-new-host-keys", "--connect-timeout", "5", str(inv))
    assert cp.returncode == 0, cp.stdout
    after = known.read_bytes()
    pub = " ".join(host_key(cluster, "node2").read_text().split()[:2])
    assert after == before + f"{address} {pub}\n".encode()  # appended; other lines untouched
    assert known.stat().st_mode & 0o777 == 0o640
    found = subprocess.run(["ssh-keygen", "-F", address, "-f", str(known)], capture_output=True,
                           text=True, check=False)
    assert found.returncode == 0  # OpenSSH reads the new line too
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".known_hosts")] == []

    cp = run_cli("check", "--connect-timeout", "5", str(inv))  # now known: strict mode passes
    assert cp.returncode == 0, cp.stdout
    assert known.read_bytes() == after


def test_explicit_interface_that_does_not_exist_lists_the_real_ones(
        cluster: Cluster, tmp_path: Path) -> None:
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS4, hosts={
        "node2": {"interface": "ens5"}, "node3": {"interface": "eth9"}})
    cp = run_cli("check", str(inv))
    assert cp.returncode == 3, cp.stdout + cp.stderr
    problem = next(line for line in cp.stdout.splitlines() if "'eth9'" in line)
    assert "does not exist there on node3" in problem
    assert f"enp3s0 ({cluster.host('node3').address}/24)" in problem
    assert "virbr0 (192.168.122.1/24)" in problem
    assert "Set `interface:`" in problem
    assert re.search(r"^node3 .*FAIL", cp.stdout, re.M)
    # An explicit interface that exists is used as given.
    assert re.search(rf"^node2 .*\bok\s+interface ens5 {cluster.host('node2').address}",
                     cp.stdout, re.M), cp.stdout
    assert cp.stdout.splitlines()[-1].startswith("1 of 4 hosts failed: node3;")


def test_a_workdir_that_cannot_be_written_fails_check_not_launch(
        cluster: Cluster, tmp_path: Path, home: Path) -> None:
    # It looked fine to `check` before (its parent exists), then launch died with a remote
    # traceback and "node lost". Now the probe creates and writes it.
    inv = cluster.inventory(tmp_path / "inv.yaml", HOSTS4[:2],
                            hosts={"node2": {"workdir": "/proc/forbidden"}})
    cp = run_cli("check", str(inv))
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert "cannot use workdir /proc/forbidden on node2" in cp.stdout
    assert re.search(r"^node1 .*\bok\b", cp.stdout, re.M), cp.stdout
    script = tmp_path / "job" / "never.py"
    script.parent.mkdir()
    script.write_text("raise SystemExit('must not run')\n")
    cp = run_cli("launch", str(inv), str(script))
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stdout + cp.stderr
    assert "preflight failed; nothing was started" in cp.stderr


def test_master_port_in_use_on_the_master(cluster: Cluster, tmp_path: Path) -> None:
    code = ("import socket, sys, time\ns = socket.socket()\ns.bind(('0.0.0.0', 0))\n"
            "s.listen()\nprint(s.getsockname()[1], flush=True)\ntime.sleep(120)\n")
    holder = start_in(cluster, "node1", [sys.executable, "-c", code])
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"], master_port=port)
        cp, report = check_json(inv)
        assert cp.returncode == 3, cp.stdout
        assert report["master_port"] == port
        master = checks(by_name(report)["node1"])["master_port"]
        assert master["ok"] is False
        assert f"port {port} on node1" in master["detail"]
        assert "in use" in master["detail"]
        data_path = checks(by_name(report)["node2"])["data_path"]
        assert data_path["ok"] is False
        assert str(port) in data_path["detail"]
    finally:
        holder.kill()
        holder.wait()


def test_torch_version_mismatch_fails_and_torch_is_never_imported(
        cluster: Cluster, tmp_path: Path) -> None:
    fake = "/tmp/clusterrun-test-faketorch"
    marker = f"{fake}/imported"
    script = (f"mkdir -p {fake}/torch && echo \"__version__ = '1.0.0'\" > {fake}/torch/version.py"
              f" && echo \"open('{marker}', 'w')\" > {fake}/torch/__init__.py")
    cluster.run_on("node2", "sh", "-c", script)
    try:
        inv = cluster.inventory(tmp_path / "inv.yaml", ["node1", "node2"], hosts={
            "node2": {"setup": f"export PYTHONPATH={fake}"}})
        cp, report = check_json(inv)
        assert cp.returncode == 3, cp.stdout
        hosts = by_name(report)
        assert hosts["node2"]["torch"] == "1.0.0"
        assert hosts["node1"]["ok"] is True
        torch = checks(hosts["node2"])["torch"]
        assert torch["ok"] is False
        assert torch["detail"].startswith(
            f"torch 1.0.0 on node2 but {metadata.version('torch')} on the master node1")
        assert cluster.run_on("node2", "sh", "-c", f"ls {marker} 2>/dev/null || true") == ""
    finally:
        cluster.run_on("node2", "rm", "-rf", fake)


def test_slow_own_name_lookup_is_a_warning(cluster: Cluster, tmp_path: Path) -> None:
    hosts_file = cluster.sb.root / "node12" / "hosts"  # bind-mounted as the host's /etc/hosts
    original = hosts_file.read_text()
    try:
        with hosts_file.open("r+") as fh:  # in place: the mount keeps pointing at this inode
            fh.write("".join(line for line in original.splitlines(keepends=True)
                             if not line.rstrip().endswith(" node12")))
            fh.truncate()
        inv = cluster.inventory(tmp_path / "inv.yaml", ["node11", "node12"])
        cp = run_cli("check", str(inv))
        assert cp.returncode == 0, cp.stdout  # a warning, not a failure
        assert re.search(r"^  node12: dns: warning: looking up its own name 'node12' failed",
                         cp.stdout, re.M), cp.stdout
        assert "/etc/hosts" in cp.stdout
        assert "node11" not in cp.stdout.split("warning", 1)[1]  # said of node12 only
    finally:
        with hosts_file.open("r+") as fh:
            fh.write(original)
            fh.truncate()


def test_ssh_config_is_honoured(cluster: Cluster, tmp_path: Path) -> None:
    """An alias from ~/.ssh/config: HostName and IdentityFile come from there."""
    home_dir = tmp_path / "userhome"
    (home_dir / ".ssh").mkdir(parents=True, mode=0o700)
    node = cluster.host("node4")
    (home_dir / ".ssh" / "config").write_text(
        f"Host gpu-alias\n    HostName {node.address}\n    User root\n"
        f"    IdentityFile {cluster.sb.identity_file}\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({
        "defaults": {"known_hosts": str(cluster.sb.known_hosts), "python": sys.executable,
                     "workdir": "/tmp/clusterrun"},
        "hosts": [{"host": "gpu-alias"}]}))
    cp = run_cli("check", "--json", str(inv), env={"HOME": str(home_dir)})
    assert cp.returncode == 0, cp.stdout + cp.stderr
    host = json.loads(cp.stdout)["hosts"][0]
    assert (host["host"], host["name"], host["interface"]) == ("gpu-alias", "gpu-alias", "eno1")
    assert checks(host)["ssh"]["detail"] == f"connected to {node.address}, hostname node4"


def test_silent_server_hits_the_banner_timeout(cluster: Cluster, tmp_path: Path) -> None:
    """TCP connects, but nothing ever says SSH-2.0: the check still ends on time."""
    code = ("import socket\ns = socket.socket()\ns.bind(('0.0.0.0', 0))\ns.listen()\n"
            "print(s.getsockname()[1], flush=True)\nheld = []\n"
            "while True:\n    held.append(s.accept())\n")
    mute = start_in(cluster, "node9", [sys.executable, "-c", code])
    try:
        assert mute.stdout is not None
        port = int(mute.stdout.readline())
        inv = cluster.inventory(tmp_path / "inv.yaml", ["node10", "node9"],
                                hosts={"node9": {"port": port}})
        start = time.monotonic()
        cp, report = check_json(inv, "--connect-timeout", "2", timeout=60)
        assert time.monotonic() - start < 7
        assert cp.returncode == 4
        ssh = checks(by_name(report)["node9"])["ssh"]
        assert ssh["ok"] is False
        assert f"node9 (root@{cluster.host('node9').address}:{port})" in ssh["detail"]
        assert "no SSH answer within 2 s" in ssh["detail"]
        assert by_name(report)["node10"]["interface"] == cluster.host("node10").ifname
    finally:
        mute.kill()
        mute.wait()


def test_accept_new_for_many_hosts_at_once(cluster: Cluster, tmp_path: Path) -> None:
    """Parallel appends lose no line; a missing file is created private; a symlinked file is
    updated where it lives."""
    missing = tmp_path / "fresh" / "known_hosts"
    names = [f"node{k}" for k in range(13, 17)]
    inv = cluster.inventory(tmp_path / "inv.yaml", names, defaults={"known_hosts": str(missing)})
    cp = run_cli("check", "--accept-new-host-keys", str(inv))
    assert cp.returncode == 0, cp.stdout
    assert missing.stat().st_mode & 0o777 == 0o600
    assert missing.parent.stat().st_mode & 0o777 == 0o700

    def expected(hosts: list[str]) -> set[str]:
        return {f"{cluster.host(n).address} "
                + " ".join(host_key(cluster, n).read_text().split()[:2]) for n in hosts}

    assert set(missing.read_text().splitlines()) == expected(names)

    real = tmp_path / "dotfiles" / "known_hosts"
    real.parent.mkdir()
    real.write_text("")
    link = tmp_path / "link_known_hosts"
    link.symlink_to(real)
    names = [f"node{k}" for k in range(17, 25)]
    inv = cluster.inventory(tmp_path / "inv.yaml", names, defaults={"known_hosts": str(link)})
    cp = run_cli("check", "--accept-new-host-keys", str(inv))
    assert cp.returncode == 0, cp.stdout
    assert link.is_symlink()
    lines = real.read_text().splitlines()
    assert len(lines) == 8
    assert set(lines) == expected(names)


# ------------------------------------------------------------------ sandbox CLI


def test_sandbox_cli_up_check_down(home: Path) -> None:
    cp = run_cli("sandbox", "up", "4", "--decoy", timeout=120)
    assert cp.returncode == 0, cp.stderr
    root = home / "sandbox"
    try:
        sb = sandbox.load(root)
        for host in sb.hosts:
            assert f"{host.name} {host.address} ({host.ifname})" in cp.stdout
        assert f"inventory: {sb.inventory}" in cp.stdout
        again = run_cli("sandbox", "up", "2")
        assert again.returncode == 2
        assert "already exists" in again.stderr

        cp, report = check_json(sb.inventory)
        assert cp.returncode == 0, cp.stdout
        assert {h["name"]: h["interface"] for h in report["hosts"]} == NICS4
    finally:
        down = run_cli("sandbox", "down", timeout=120)
    assert down.returncode == 0, down.stderr
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    assert sb.prefix not in spaces
    assert not (root / "sandbox.json").exists()
