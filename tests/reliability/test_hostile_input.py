"""Scenario 8: shell metacharacters in what a user (or a host) hands clusterrun are refused with
a clear message or passed byte-exact; never run.

Script arguments and env values are covered byte-exact by tests/test_launch.py
(test_hostile_arguments_and_env_arrive_byte_exact). Here: host names, users, names and env
keys in the inventory (refused before any SSH), and interface names, which Linux allows to hold
`;`, `$`, `(` and `>`: a real NIC renamed so, used through `interface:`, must reach the ranks
as NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME byte-exact, and a decoy so named must show up as-is
in check's list of a host's real interfaces. Each payload would create a file if a shell ever
evaluated it; no such file may appear on any host or on this machine.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Cluster, run_cli, write_inventory
from tests.reliability.conftest import Timed

TOKEN = "PWN" + uuid.uuid4().hex[:4]  # 7 characters: room for a payload in 15
# If a shell ever evaluated it: `a` fails, then `>PWNxxxx$(x)` creates the file PWNxxxx.
HOSTILE_NIC = f"a;>{TOKEN}$(x)"
HOSTILE_DECOY = "x;$(touch"  # the example
NIC_HOST, MASTER, DECOY_HOST = "node16", "node15", "node17"
PWNED = f"/var/tmp/PWNED-{TOKEN}"


def ip(cluster: Cluster, name: str, *args: str) -> None:
    subprocess.run(["ip", "-n", cluster.host(name).netns, *args], check=True)


def rename_nic(cluster: Cluster, name: str, old: str, new: str) -> None:
    ip(cluster, name, "link", "set", old, "down")
    ip(cluster, name, "link", "set", old, "name", new)
    ip(cluster, name, "link", "set", new, "up")


@pytest.fixture
def hostile_nic(cluster: Cluster) -> Iterator[str]:
    """NIC_HOST's real NIC renamed to HOSTILE_NIC, renamed back afterwards."""
    real = cluster.host(NIC_HOST).ifname
    assert len(HOSTILE_NIC.encode()) <= 15
    rename_nic(cluster, NIC_HOST, real, HOSTILE_NIC)
    try:
        yield HOSTILE_NIC
    finally:
        rename_nic(cluster, NIC_HOST, HOSTILE_NIC, real)


@pytest.fixture
def hostile_decoy(cluster: Cluster) -> Iterator[str]:
    """A decoy veth pair named with metacharacters inside DECOY_HOST, removed afterwards."""
    ip(cluster, DECOY_HOST, "link", "add", HOSTILE_DECOY, "type", "veth", "peer", "name",
       f"y;>{TOKEN}")
    try:
        yield HOSTILE_DECOY
    finally:
        ip(cluster, DECOY_HOST, "link", "del", HOSTILE_DECOY)


def no_payload_ran(cluster: Cluster, names: list[str], *where: Path) -> None:
    """Neither the token file (relative: any working directory) nor PWNED exists anywhere a
    shell could have run: the hosts' own /tmp, their home, the shared /var/tmp, here."""
    for name in names:
        found = cluster.run_on(name, "sh", "-c", f"find /tmp /root /var/tmp -maxdepth 6 "
                               f"-name '{TOKEN}*' -o -name 'PWNED-{TOKEN}' 2>/dev/null; true")
        assert found.strip() == "", (name, found)
    for folder in (REPO, Path.home(), *where):
        assert not list(folder.glob(f"{TOKEN}*")), folder
    assert not Path(PWNED).exists()


@pytest.mark.parametrize(("entry", "words"), [
    ({"host": f"h1;touch {PWNED}"}, ("hosts[0].host", "is not allowed", "shell characters")),
    ({"host": f"$(touch {PWNED})"}, ("hosts[0].host", "is not allowed")),
    ({"host": "h1", "name": f"n`touch {PWNED}`"}, ("hosts[0].name", "is not allowed")),
    ({"host": "h1", "user": f"u$(touch {PWNED})"}, ("user", "is not allowed")),
    ({"host": "h1", "env": {f"K;touch {PWNED}": "v"}}, ("env",)),
    ({"host": "h1", "container": f"c;touch {PWNED}"}, ("container", "is not allowed")),
], ids=["host-semicolon", "host-subshell", "name-backtick", "user-subshell", "env-key",
        "container"])
def test_hostile_inventory_values_are_refused_before_any_ssh(
        tmp_path: Path, entry: dict, words: tuple[str, ...], timed,
        request: pytest.FixtureRequest) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", [entry, {"host": "h2"}])
    # The time is the CLI's own start (an interpreter, its imports) with the refusal in it: a
    # loaded CI machine took 5.5 s against the 5 s this had. The bound only keeps a hang from
    # passing; that nothing ran is what the assertions below check.
    with timed(f"hostile inventory value ({request.node.callspec.id}): refused", 20) as t:
        cp = run_cli("check", "--connect-timeout", "1", str(inv), timeout=30)
        t.stop()
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert cp.stderr.startswith(f"clusterrun: error: {inv}:"), cp.stderr
    for word in words:
        assert word in cp.stderr, (word, cp.stderr)
    assert "Traceback" not in cp.stderr
    assert not Path(PWNED).exists()


def test_a_hostile_interface_name_used_for_real_reaches_the_ranks_byte_exact(
        cluster: Cluster, home: Path, tmp_path: Path, payload: Path, *, hostile_nic: str,
        timed: Timed) -> None:
    names = [MASTER, NIC_HOST]
    inv = cluster.inventory(tmp_path / "inv.yaml", names,
                            hosts={NIC_HOST: {"interface": hostile_nic}})
    test_dir = f"/var/tmp/clusterrun-hostile-{TOKEN}"
    try:
        with timed("hostile interface name: check + launch on 2 hosts", 60) as t:
            cp = run_cli("check", str(inv), timeout=60)
            assert cp.returncode == 0, cp.stdout + cp.stderr
            assert f"interface {hostile_nic} {cluster.host(NIC_HOST).address}" in cp.stdout
            cp = run_cli("launch", "--env", f"TEST_DIR={test_dir}", str(inv), str(payload),
                         timeout=120)
            t.stop()
        assert cp.returncode == 0, cp.stdout + cp.stderr
        records = {}
        for path in Path(test_dir).glob("rank-*.json"):
            data = json.loads(path.read_text())
            records[data["env"]["CLUSTERRUN_NODE"]] = data
        assert set(records) == set(names), records
        env = records[NIC_HOST]["env"]
        assert env["GLOO_SOCKET_IFNAME"] == hostile_nic
        assert env["NCCL_SOCKET_IFNAME"] == hostile_nic
        assert hostile_nic in records[NIC_HOST]["interfaces"]
        assert records[MASTER]["env"]["GLOO_SOCKET_IFNAME"] == cluster.host(MASTER).ifname
        assert cluster.wait_no_processes(names, 10) == {}
        no_payload_ran(cluster, names, home, tmp_path)
    finally:
        subprocess.run(["rm", "-rf", test_dir], check=False)


@pytest.mark.usefixtures("home")
def test_a_hostile_interface_name_is_listed_as_is_and_never_run(
        cluster: Cluster, tmp_path: Path, hostile_decoy: str, timed: Timed) -> None:
    names = [MASTER, DECOY_HOST]
    inv = cluster.inventory(tmp_path / "inv.yaml", names,
                            hosts={DECOY_HOST: {"interface": "nosuch0"}})
    with timed("hostile interface name in check's listing", 20) as t:
        cp = run_cli("check", str(inv), timeout=60)
        t.stop()
    assert cp.returncode == 3, cp.stdout + cp.stderr
    line = next(x for x in cp.stdout.splitlines() if "interface 'nosuch0' does not exist" in x)
    assert f"{DECOY_HOST}. Its interfaces: " in line
    assert f"{hostile_decoy} (no IPv4 DOWN)" in line, line
    assert f"y;>{TOKEN} (no IPv4 DOWN)" in line, line
    # Used as `interface:`, the decoy (down, no address) is refused by name, not run.
    inv = cluster.inventory(tmp_path / "inv2.yaml", names,
                            hosts={DECOY_HOST: {"interface": hostile_decoy}})
    cp = run_cli("check", str(inv), timeout=60)
    assert cp.returncode == 3, cp.stdout + cp.stderr
    assert f"interface {hostile_decoy!r} is down on {DECOY_HOST}" in cp.stdout, cp.stdout
    no_payload_ran(cluster, names, tmp_path)


# ------------------------------------------------------------------ YAML that expands
# An alias makes a graph of the YAML tree: nine levels of nine aliases in a few hundred bytes
# stand for 387 million values, and `&a [*a]` for an endless one. Composing such a file is cheap
# (the aliases are shared nodes); converting it is what never ends. So these tests count the
# values converted (none may be, once the file is refused) rather than trust a clock on a
# loaded machine; `timed` keeps a generous bound only so a regression fails instead of hanging.

def _bomb(under_env: bool) -> str:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    if under_env:
        return "hosts:\n  - host: h1\n    env:\n" + "".join(f"      {lv}\n" for lv in levels)
    return "\n".join(levels) + "\nhosts:\n  - host: h1\n"


ALIASES = {
    "recursive": ("hosts:\n  - host: h1\n    env: &a [*a]\n", 3),
    "bomb": (_bomb(under_env=False), 1),
    "bomb-under-env": (_bomb(under_env=True), 4),
    "merge-key": ("defaults: &d\n  user: root\nhosts:\n  - host: h1\n    <<: *d\n", 1),
    "alias-only": ("hosts:\n  - host: h1\n  - *h\n", 3),
}


@pytest.fixture
def converted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many YAML values were converted; fails the test past 100,000, so a file that expands
    without end fails here instead of hanging."""
    from clusterrun.inventory import yaml_lines

    made = [0]

    class Counted(yaml_lines.Located):
        def __init__(self, value: Any, line: int) -> None:
            made[0] += 1
            assert made[0] < 100_000, "the inventory's YAML is being expanded"
            super().__init__(value, line)

    monkeypatch.setattr(yaml_lines, "Located", Counted)
    return made


@pytest.mark.parametrize("case", list(ALIASES))
def test_yaml_anchors_and_aliases_are_refused_before_anything_is_expanded(
        tmp_path: Path, case: str, converted: list[int], timed: Timed,
        capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import run_main

    text, line = ALIASES[case]
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    assert len(text.encode()) < 600
    with timed(f"YAML aliases ({case}): refused", 10):
        code, out, err = run_main(capsys, "hosts", str(path))
    assert (code, out) == (2, ""), err
    assert err.startswith(f"clusterrun: error: {path}:{line}: "), err
    assert "anchors and aliases are not supported" in err and "write the value out" in err
    assert "Traceback" not in err
    assert converted[0] == 0  # refused while parsing: nothing was built from it


def test_deep_nesting_is_refused_with_its_line(tmp_path: Path, converted: list[int]) -> None:
    from clusterrun import inventory
    from clusterrun.errors import InventoryError

    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  - host: h1\n    env: " + "[" * 5000 + "\n")
    with pytest.raises(InventoryError, match=r"inv.yaml:3: values nested more than 32 levels"):
        inventory.load(path)
    assert converted[0] == 0


@pytest.mark.parametrize(("value", "shown"), [
    ('!!int ""', "'' as a YAML int"),
    ("!!bool maybe", "'maybe' as a YAML bool"),
    ("!!float one", "'one' as a YAML float"),
    ("0x" + "f" * 4000, "as a YAML int"),  # hex has no digit limit; printing it in decimal has
    ('!!python/name:os.system ""', "cannot read this value"),
])
def test_a_tagged_value_that_cannot_be_built_is_refused_with_its_line(
        tmp_path: Path, value: str, shown: str) -> None:
    from clusterrun import inventory
    from clusterrun.errors import InventoryError

    path = tmp_path / "inv.yaml"
    path.write_text(f"hosts:\n  - host: h1\n    port: {value}\n")
    with pytest.raises(InventoryError) as info:
        inventory.load(path)
    assert info.value.message.startswith(f"{path}:3: "), info.value.message
    assert shown in info.value.message


@pytest.mark.parametrize(("hosts", "words"), [
    ("  - host: n[1-100000000]\n", "stands for more than 4096 hosts"),
    ("  - host: n[1-10000]m[1-10000]\n", "stands for more than 4096 hosts"),
    ("".join(f"  - host: r{i}-[1-4000]\n" for i in range(50)), "more than 4096 hosts in all"),
])
def test_a_range_too_large_is_refused_without_expanding_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: str, words: str) -> None:
    """NodeSet builds every name before it can count them (ten seconds and gigabytes for
    n[1-100000000]): a range past the limit must be refused before NodeSet sees it; fifty
    ranges each within it, before all their hosts are validated."""
    from ClusterShell import NodeSet as nodeset

    from clusterrun import inventory
    from clusterrun.errors import InventoryError

    load_module = importlib.import_module("clusterrun.inventory.load")
    real, built, validated = nodeset.NodeSet, [], [0]

    def counted(text: str) -> object:
        built.append(text)
        assert len(built) < 100, "a range past the limit was expanded"
        assert "100000000" not in text and "[1-10000]" not in text, "expanded: " + text
        return real(text)

    real_host = load_module._host

    def host(*args: object, **kwargs: object) -> object:
        validated[0] += 1
        return real_host(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(nodeset, "NodeSet", counted)
    monkeypatch.setattr(load_module, "_host", host)
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n" + hosts)
    with pytest.raises(InventoryError, match=words):
        inventory.load(path)
    assert validated[0] == 0


def test_an_endless_file_as_inventory_is_refused_after_a_bounded_read(
        capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/zero (or a multi-gigabyte log given by mistake) was read whole before parsing."""
    from tests.conftest import run_main

    code, out, err = run_main(capsys, "hosts", "/dev/zero")
    assert (code, out) == (2, ""), err
    assert err.startswith("clusterrun: error: /dev/zero: more than 16 MB"), err


@pytest.mark.timeout(60)  # a regression blocks opening the drained pipe a second time
def test_an_inventory_from_a_pipe_is_read_whole(tmp_path: Path) -> None:
    """`clusterrun hosts <(generate)`: the check for a swapped script must not take the head of
    a pipe the loader then reads."""
    import os
    import threading

    from clusterrun import inventory

    fifo = tmp_path / "inv.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text,
                              args=("hosts:\n  - host: localhost\n    name: piped\n",))
    writer.start()
    try:
        assert [h.name for h in inventory.load(fifo).hosts] == ["piped"]
    finally:
        writer.join(timeout=10)
