"""Inventory validation: every malformed inventory is refused by the real CLI with exit 2, a
`file:line` message naming the key and the fix, no traceback, and before any SSH.

"Before any SSH" is observed, not assumed: every inventory that can name a host names one whose
address and port are a TCP listener of this test (127.0.0.2 is not "local" to clusterrun, so it
would be reached over SSH); after the command, the listener's queue must be empty.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterrun import inventory
from clusterrun.errors import InventoryError
from tests.conftest import LISTEN_HOST, connection_attempted, run_cli


@dataclass(frozen=True)
class Bad:
    """A malformed inventory: its text ({H}/{P}: the listener's address and port), the line the
    message must point at, and words the message must contain (the key, the fix)."""

    text: str
    line: int
    words: tuple[str, ...]


HOSTILE = {
    "leading-dash": "-oProxyCommand=touch /tmp/pwned",
    "semicolon": "a;touch /tmp/pwned",
    "command-substitution": "$(touch /tmp/pwned)",
    "backticks": "`touch /tmp/pwned`",
    "space": "a b",
    "newline-inside": "a\nb",
    "trailing-newline": "node1\n",  # a regex with `$` lets this one through
    "ipv6-zone": "fe80::1%x;id",  # ipaddress accepts any zone text
}


def _q(value: str) -> str:
    """A double-quoted YAML scalar that keeps every character."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


CASES: dict[str, Bad] = {
    "yaml-syntax-indent": Bad(
        "hosts:\n  - host: {H}\n   port: {P}\n", 3, ("YAML syntax error", "indentation")),
    "yaml-syntax-unclosed": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    gpus: [0, 1\n", 5,
        ("YAML syntax error", "line 4")),
    "yaml-syntax-tab": Bad("hosts:\n\t- host: {H}\n", 2, ("YAML syntax error",)),
    "duplicate-key-host": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    port: 22\n", 4,
        ("duplicate key `port`", "line 3", "Remove one")),
    "duplicate-key-top": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\nhosts:\n  - host: 127.0.0.3\n", 4,
        ("duplicate key `hosts`", "line 1", "Remove one")),
    "duplicate-key-defaults": Bad(
        "defaults:\n  port: {P}\n  user: a\n  user: b\nhosts:\n  - host: {H}\n", 4,
        ("duplicate key `user`", "line 3")),
    "unknown-key-defaults": Bad(
        "defaults:\n  port: {P}\n  identity_fle: ~/.ssh/id_ed25519\nhosts:\n  - host: {H}\n", 3,
        ("identity_fle", "Did you mean `identity_file`")),
    "unknown-key-host": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    nmae: gpu-a\n", 4,
        ("nmae", "Did you mean `name`")),
    "unknown-key-top": Bad(
        "defaults:\n  port: {P}\nhost:\n  - host: {H}\n", 3, ("`host`", "Did you mean `hosts`")),
    "port-string": Bad(
        'defaults:\n  port: {P}\nhosts:\n  - host: {H}\n  - host: 127.0.0.3\n    port: "22"\n',
        6, ("port", "without quotes")),
    "port-zero": Bad(
        "defaults:\n  port: {P}\nhosts:\n  - host: {H}\n  - host: 127.0.0.3\n    port: 0\n", 6,
        ("port", "1 to 65535")),
    "port-too-big": Bad(
        "defaults:\n  port: {P}\nhosts:\n  - host: {H}\n  - host: 127.0.0.3\n    port: 70000\n",
        6, ("port", "70000", "1 to 65535")),
    "master-port-too-big": Bad(
        "master_port: 65536\nhosts:\n  - host: {H}\n    port: {P}\n", 1,
        ("master_port", "1 to 65535")),
    "nproc-zero": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    nproc_per_node: 0\n", 4,
        ("nproc_per_node", "positive integer or `auto`")),
    "gpus-repeated": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    gpus: [0, 0]\n", 4,
        ("gpus", "distinct GPU indices")),
    "env-list-value": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    env: {{A: [1]}}\n", 4,
        ("env", "A", "string or number")),
    "host-yaml-bool": Bad(
        "defaults:\n  port: {P}\nhosts:\n  - host: {H}\n  - host: no\n", 5,
        ("host", "bool", "quote it")),
    "master-not-bool": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    master: maybe\n", 4,
        ("master", "true or false")),
    "master-addr-not-ip": Bad(
        "master_addr: gpu-a.example\nhosts:\n  - host: {H}\n    port: {P}\n", 1,
        ("master_addr", "`auto` or an IP address")),
    "empty-host-list": Bad("defaults:\n  port: {P}\nhosts: []\n", 3, ("`hosts:`", "non-empty")),
    "hosts-missing": Bad("defaults:\n  port: {P}\n", 1, ("`hosts:`", "- host:")),
    "host-key-missing": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n  - name: gpu-b\n", 4, ("missing `host:`",)),
    "two-masters": Bad(
        "defaults:\n  port: {P}\nhosts:\n  - host: {H}\n    master: true\n"
        "  - host: 127.0.0.3\n    master: true\n", 6,
        ("more than one host has `master: true`", "lines 4, 6", "mark exactly one")),
    "same-host-twice": Bad(
        "defaults:\n  port: {P}\nhosts:\n  - host: {H}\n    name: a\n  - host: {H}\n    name: b\n",
        6, ("listed twice", "line 4", "Remove one")),
    "same-name-twice": Bad(
        "defaults:\n  port: {P}\nhosts:\n  - host: {H}\n    name: a\n  - host: 127.0.0.3\n"
        "    name: a\n", 6, ("name 'a'", "line 4", "its own `name:`")),
    "user-at-host": Bad(
        "defaults:\n  port: {P}\nhosts:\n  - host: {H}\n  - host: root@127.0.0.3\n", 5,
        ("root@127.0.0.3", "`user:`")),
    "empty-file": Bad("", 1, ("empty", "`hosts:`")),
    "top-level-list": Bad("- host: {H}\n", 1, ("is a list", "under `hosts:`")),
    "top-level-master": Bad(
        "master: true\nhosts:\n  - host: {H}\n    port: {P}\n", 1,
        ("`master:` is a host's key", "`master: true` under the host")),
    "top-level-setting": Bad(
        "user: root\nhosts:\n  - host: {H}\n    port: {P}\n", 1,
        ("`user:` is a host setting", "`defaults:`")),
    "identity-file-missing": Bad(
        "defaults:\n  port: {P}\n  identity_file: /nonexistent/clusterrun-test/id_ed25519\n"
        "hosts:\n  - host: {H}\n", 3, ("identity_file", "no such file", "ssh-keygen")),
    "identity-file-directory": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    identity_file: /tmp\n", 4,
        ("identity_file '/tmp' is a directory", "the private key")),
    "known-hosts-directory": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    known_hosts: /tmp\n", 4,
        ("known_hosts '/tmp' is a directory",)),
    **{f"hostile-host-{label}": Bad(
        "defaults:\n  port: {P}\nhosts:\n  - host: {H}\n  - host: " + _q(value) + "\n", 5,
        ("host", "is not allowed", "letters, digits")) for label, value in HOSTILE.items()},
    **{f"hostile-user-{label}": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    user: " + _q(value) + "\n", 4,
        ("user", "is not allowed", "letters, digits")) for label, value in HOSTILE.items()
        if label != "ipv6-zone"},
    "hostile-interface-trailing-newline": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    interface: \"eth0\\n\"\n", 4,
        ("interface", "is not allowed")),
    "hostile-name": Bad(
        "hosts:\n  - host: {H}\n    port: {P}\n    name: \"../../etc\"\n", 4,
        ("name", "is not allowed")),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_malformed_inventory_is_refused_before_any_ssh(
        case: str, tmp_path: Path, listener: socket.socket) -> None:
    bad = CASES[case]
    path = tmp_path / "inventory.yaml"
    port = listener.getsockname()[1]
    path.write_text(bad.text.replace("{H}", LISTEN_HOST).replace("{P}", str(port))
                    .replace("{{", "{").replace("}}", "}"))
    cp = run_cli("check", "--connect-timeout", "2", str(path), timeout=30)
    assert cp.returncode == 2, cp.stderr + cp.stdout
    assert "Traceback" not in cp.stderr
    assert cp.stdout == ""  # no report: nothing was checked
    assert f"{path}:{bad.line}:" in cp.stderr, cp.stderr
    for word in bad.words:
        assert word in cp.stderr, (word, cp.stderr)
    # The proof that nothing was contacted: the listener standing in for the host saw nothing.
    assert not connection_attempted(listener), "clusterrun connected before validating"


def test_duplicate_key_message_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("defaults:\n  user: a\n  port: 22\n  user: b\nhosts:\n  - host: h1\n")
    with pytest.raises(InventoryError) as info:
        inventory.load(path)
    assert info.value.message.startswith(f"{path}:4: duplicate key `user` (first set on line 2)")


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  - host: h1\n    port: 0\n  - host: h2\n    nproc_per_node: -1\n"
                    "  - host: \"$(id)\"\n")
    with pytest.raises(InventoryError) as info:
        inventory.load(path)
    lines = info.value.message.splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [f"{path}:3", f"{path}:5", f"{path}:6"]


def test_missing_file(tmp_path: Path, listener: socket.socket) -> None:
    path = tmp_path / "nope.yaml"
    cp = run_cli("check", str(path), timeout=30)
    assert cp.returncode == 2
    assert "Traceback" not in cp.stderr
    assert f"{path}: no such inventory file" in cp.stderr
    assert "hosts: [{host: gpu-a}" in cp.stderr  # the fix: the smallest inventory
    assert not connection_attempted(listener)


def test_exec_validates_too(tmp_path: Path, listener: socket.socket) -> None:
    path = tmp_path / "inv.yaml"
    port = listener.getsockname()[1]
    path.write_text(f"hosts:\n  - host: {LISTEN_HOST}\n    port: {port}\n    prot: 22\n")
    cp = run_cli("exec", str(path), "--", "touch /tmp/pwned", timeout=30)
    assert cp.returncode == 2
    assert f"{path}:4:" in cp.stderr
    assert "Did you mean `port`" in cp.stderr
    assert "Traceback" not in cp.stderr
    assert not connection_attempted(listener)


# ------------------------------------------------------------------ valid inventories


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path


def test_defaults_merge_and_host_overrides(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the key must exist: it is read at load time
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("key\n")
    inv = inventory.load(write(tmp_path, """\
defaults:
  user: ubuntu
  port: 2222
  identity_file: ~/.ssh/id_ed25519
  python: /opt/py/bin/python3
  setup: source ~/venv/bin/activate
  workdir: ~/work
  nproc_per_node: 2
  env: {NCCL_DEBUG: WARN, SHARED: base}
master_addr: 10.0.0.11
master_port: 29500
hosts:
  - host: 10.0.0.11
    name: gpu-a
    gpus: [0, 1]
  - host: 10.0.0.12
    user: admin
    port: 22
    nproc_per_node: auto
    interface: ens5
    env: {SHARED: mine, EXTRA: 1}
  - 10.0.0.13
"""))
    a, b, c = inv.hosts
    assert inv.master_addr == "10.0.0.11"
    assert inv.master_port == 29500
    assert (a.host, a.name, a.user, a.port, a.gpus, a.nproc_per_node, a.interface) == (
        "10.0.0.11", "gpu-a", "ubuntu", 2222, (0, 1), 2, "auto")
    assert a.env_dict == {"NCCL_DEBUG": "WARN", "SHARED": "base"}
    assert (a.python, a.setup, a.workdir, a.identity_file) == (
        "/opt/py/bin/python3", "source ~/venv/bin/activate", "~/work", "~/.ssh/id_ed25519")
    # A host's env overrides the defaults' per key and keeps the others; values become strings.
    assert b.env_dict == {"NCCL_DEBUG": "WARN", "SHARED": "mine", "EXTRA": "1"}
    assert (b.name, b.user, b.port, b.nproc_per_node, b.interface) == (
        "10.0.0.12", "admin", 22, "auto", "ens5")
    assert (c.host, c.name, c.user, c.port, c.gpus) == ("10.0.0.13", "10.0.0.13", "ubuntu", 2222,
                                                        None)
    assert c.env_dict == a.env_dict
    assert [h.line for h in inv.hosts] == [13, 16, 22]
    # Frozen: nothing downstream can change what was validated.
    with pytest.raises(AttributeError):
        a.port = 1  # type: ignore[misc]


def test_master_defaults_to_first_host(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, "hosts:\n  - host: h1\n  - host: h2\n"))
    assert [h.master for h in inv.hosts] == [True, False]
    assert inv.master.name == "h1"
    assert inv.master_addr == "auto"
    assert inv.master_port is None


def test_explicit_master(tmp_path: Path) -> None:
    inv = inventory.load(write(
        tmp_path, "master_port: auto\nhosts:\n  - host: h1\n  - host: h2\n    master: true\n"))
    assert [h.master for h in inv.hosts] == [False, True]
    assert inv.master.name == "h2"
    assert inv.master_port is None


def test_two_localhost_nodes_with_distinct_names(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, "hosts:\n  - host: localhost\n    name: a\n"
                               "  - host: localhost\n    name: b\n"))
    assert [(h.host, h.name, h.local) for h in inv.hosts] == [("localhost", "a", True),
                                                             ("localhost", "b", True)]


def test_two_localhost_nodes_need_distinct_names(tmp_path: Path) -> None:
    with pytest.raises(InventoryError,
                       match=r":3: the name 'localhost' is already used by the host on line 2"):
        inventory.load(write(tmp_path, "hosts:\n  - host: localhost\n  - host: localhost\n"))


def test_python_defaults(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, "hosts:\n  - host: localhost\n  - host: 127.0.0.1\n"
                               "    name: lo2\n  - host: gpu-b\n"))
    local, local2, remote = inv.hosts
    assert local.python == sys.executable
    assert local2.python == sys.executable
    assert remote.python == "python3"
    assert not remote.local


def test_empty_defaults_and_env_sections_are_allowed(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, "defaults:\n  # user: me\nhosts:\n  - host: h1\n"
                               "    env:\n"))
    assert inv.hosts[0].env == ()


def test_ipv6_hosts(tmp_path: Path) -> None:
    inv = inventory.load(write(tmp_path, "hosts:\n  - host: fd00::11\n  - host: fe80::1%eth0\n"))
    assert [h.name for h in inv.hosts] == ["fd00--11", "fe80--1-eth0"]


# ------------------------------------------------------------------ DNS name lengths


@pytest.mark.parametrize(("host", "words"), [
    ("a" * 64 + ".example.com", ("label", "64 characters", "at most 63")),
    (".".join(["a" * 50] * 6), ("305 characters", "at most 253")),
    ("a." * 150, ("300 characters", "at most 253")),
], ids=["label-64", "name-305", "name-300"])
def test_host_name_lengths_are_refused_before_any_ssh(
        host: str, words: tuple[str, ...], tmp_path: Path, listener: socket.socket) -> None:
    """A 64-character label used to pass validation and then fail inside SSH with an `idna`
    UnicodeError (exit 3); a 300-character name was refused without saying why."""
    path = tmp_path / "inventory.yaml"
    port = listener.getsockname()[1]
    path.write_text(f"hosts:\n  - host: {LISTEN_HOST}\n    port: {port}\n"
                    f"  - host: {host}\n    port: {port}\n")
    cp = run_cli("check", "--connect-timeout", "2", str(path), timeout=30)
    assert cp.returncode == 2, cp.stderr + cp.stdout
    assert cp.stderr.startswith(f"clusterrun: error: {path}:4: ")
    for word in words:
        assert word in cp.stderr, (word, cp.stderr)
    assert "Traceback" not in cp.stderr and "idna" not in cp.stderr
    assert not connection_attempted(listener)


def test_longest_valid_names_pass(tmp_path: Path) -> None:
    label63 = "a" * 63
    longest = ".".join([label63] * 3 + ["b" * 61])  # 253 characters
    assert len(longest) == 253
    inv = inventory.load(write(tmp_path, f"hosts:\n  - host: {label63}.example.com\n"
                               f"  - host: {longest}\n  - host: {longest}.\n    name: dot\n"))
    assert [h.host for h in inv.hosts] == [f"{label63}.example.com", longest, f"{longest}."]


# ------------------------------------------------------------------ local hosts' workdir


def test_local_hosts_keep_their_files_under_clusterrun_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """inventories/localhost.yaml used to say `workdir: ~/.clusterrun/local-nodes`, whatever
    CLUSTERRUN_HOME said."""
    repo = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("CLUSTERRUN_HOME", str(tmp_path / "home"))
    inv = inventory.load(repo / "inventories" / "localhost.yaml")
    assert {h.workdir for h in inv.hosts} == {f"{tmp_path}/home/local-nodes"}
    monkeypatch.delenv("CLUSTERRUN_HOME")
    inv = inventory.load(repo / "inventories" / "localhost.yaml")
    assert {h.workdir for h in inv.hosts} == {"~/.clusterrun/local-nodes"}
    # A remote host's default stays on that host; an explicit workdir is kept as written.
    inv = inventory.load(write(tmp_path, "hosts:\n  - host: gpu-a\n  - host: localhost\n"
                               "    workdir: /scratch/cr\n"))
    assert [h.workdir for h in inv.hosts] == ["~/clusterrun", "/scratch/cr"]


@pytest.mark.parametrize("script", [
    "train.py",  # by its name
    "train",  # by what it holds
])
def test_a_script_given_as_the_inventory_is_said_to_be_swapped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], script: str) -> None:
    from tests.conftest import run_main

    path = tmp_path / script
    path.write_text("#!/usr/bin/env python3\nimport torch\n\nprint(torch.__version__)\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - host: localhost\n")
    code, out, err = run_main(capsys, "launch", "--dry-run", str(path), str(inv))
    assert (code, out) == (2, ""), err
    assert f"{path}: INVENTORY looks like a Python script" in err
    assert "`clusterrun launch INVENTORY SCRIPT`" in err
    assert "Traceback" not in err


def test_a_missing_key_is_refused_at_load_and_a_present_one_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/exit-status.md: a missing identity_file is exit 2 with nothing contacted; a missing
    known_hosts is not an error (--accept-new-host-keys creates it)."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "defaults:\n  identity_file: keys/id\n  known_hosts: kh\n"
                 "hosts:\n  - host: 10.0.0.11\n")
    with pytest.raises(InventoryError) as info:
        inventory.load(path)
    assert info.value.message == (
        f"{path}:2: identity_file 'keys/id' ({tmp_path / 'keys' / 'id'}): no such file. Fix the "
        "path, or create the key (ssh-keygen -t ed25519) and install its .pub on the hosts.")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("key\n")
    assert inventory.load(path).hosts[0].identity_file == "keys/id"


def test_the_lines_pip_freeze_and_uv_export_write_are_read(tmp_path: Path) -> None:
    """Direct references and markers: read as pins that say where their wheel is and which
    hosts they are for (the wheels are gathered per host platform: envs/wheels.py)."""
    wheel = tmp_path / "wheels" / "mypkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK")
    (tmp_path / "req.lock").write_text(
        f"six==1.16.0\nmypkg @ file://{wheel}\n"
        "torch @ https://example.org/torch-2.13.0-cp311-none-any.whl\n"
        'numpy==2.3.4 ; sys_platform == "linux"\n')
    path = write(tmp_path, "hosts:\n  - host: 10.0.0.11\n    environment: req.lock\n")
    env = inventory.load(path).hosts[0].environment
    assert env is not None
    found = {p.name: (p.version, p.marker, [f.location for f in p.files]) for p in env.pins}
    assert found == {"six": ("1.16.0", None, []), "mypkg": ("1.0", None, [str(wheel)]),
                     "torch": ("2.13.0", None,
                               ["https://example.org/torch-2.13.0-cp311-none-any.whl"]),
                     "numpy": ("2.3.4", 'sys_platform == "linux"', [])}
