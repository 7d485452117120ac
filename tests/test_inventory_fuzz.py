"""Fuzzing the inventory loader: any file handed to it as INVENTORY (a YAML inventory, a hostfile,
or the hostfile an inventory names) is read into an Inventory or refused with InventoryError
(exit 2, one message with its file and line); never any other exception, and never slowly.

The examples are derived from a fixed seed (``derandomize``) with no example database, so CI
runs the same ones every time. They start from inventories that load and are then mutated:
values swapped for YAML's other kinds (tags, anchors, deep brackets, huge numbers, long names),
keys misplaced, bytes inserted and cut.

Time: each example is a few hundred bytes and loads in milliseconds; the bound asserted is two
seconds, far above what a loaded CI machine needs, so that it catches only what grows with the
input (an expansion, a backtracking regex), never a slow moment of the machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterrun import inventory
from clusterrun.errors import InventoryError

SECONDS = 2.0
FUZZ = settings(derandomize=True, database=None, max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

HOST_KEYS = ["host", "name", "master", "gpus", "spare", "user", "port", "identity_file",
             "known_hosts", "python", "setup", "workdir", "nproc_per_node", "interface", "env",
             "forward_env", "env_file", "container", "container_engine", "container_user",
             "proxy_jump", "environment"]
TOP_KEYS = ["defaults", "master_addr", "master_port", "hosts", "hostfile", "transport"]

# Scalars as YAML text: the kinds a value may take, the odd ones included.
ODD = ["true", "no", "~", "auto", "slurm", "0", "-1", "65536", "1e400", ".nan",
       "0x" + "f" * 5000, "9" * 5000, "2024-01-01", "!!int ''", "!!bool maybe", "!!float x",
       "!!binary '#'", "!!python/name:os.system ''", "!!set {a}", "&a x", "*a", "[" * 200,
       "{" * 50, "n[1-100000000]", "a[1-4096]", "gpu[01-16]", "'a' ", '"\\0"', '"a\\nb"',
       "x" * 300, "/tmp", ".", "~/" + "d" * 300, "req.lock", "hosts.txt", "10.0.0.11", "::1",
       "localhost", "fe80::1%eth0", "u@h:22", "[::1]:22", "|\n  block", "[a, b]", "{a: 1}"]
SCALARS = st.one_of(
    st.sampled_from(ODD),
    st.sampled_from(ODD),  # twice: half the values are odd ones
    st.integers(-2**70, 2**70).map(str),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
            max_size=12).map(lambda t: yaml.safe_dump(t).removesuffix("\n...\n").strip()),
)


def _host(draw: Any) -> str:
    keys = draw(st.lists(st.sampled_from(HOST_KEYS), max_size=4, unique=True))
    body = "".join(f"    {k}: {draw(SCALARS)}\n" for k in keys)
    return f"  - host: {draw(st.sampled_from(['10.0.0.11', 'localhost', 'n[1-3]']))}\n{body}"


@st.composite
def documents(draw: Any) -> str:
    """An inventory: a few hosts, maybe defaults and top-level keys, each value any kind."""
    parts = []
    if draw(st.booleans()):
        keys = draw(st.lists(st.sampled_from(HOST_KEYS[5:]), max_size=3, unique=True))
        parts.append("defaults:\n" + "".join(f"  {k}: {draw(SCALARS)}\n" for k in keys))
    for key in draw(st.lists(st.sampled_from([*TOP_KEYS[1:], "master", "user"]), max_size=2,
                             unique=True)):
        parts.append(f"{key}: {draw(SCALARS)}\n")
    parts.append("hosts:\n" + "".join(_host(draw) for _ in range(draw(st.integers(0, 3)))))
    return "".join(draw(st.permutations(parts)))


YAML_BYTES = st.sampled_from([*":-[]{}&*!|>'\"#%@`,?\n\t \\", "\n  ", "- ", ": ", "\x00",
                              "\ufeff", "\x85"])


@st.composite
def mutated(draw: Any, base: st.SearchStrategy[str]) -> str:
    """``base`` with a few cuts, insertions and replacements of YAML's syntax characters."""
    text = draw(base)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        choice = draw(st.integers(0, 2))
        if choice == 0:
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        elif choice == 1:
            text = text[:at] + draw(YAML_BYTES) + text[at:]
        else:
            text = text[:at] + draw(YAML_BYTES) + text[at + 1:]
    return text


HOSTFILES = st.lists(st.one_of(
    st.sampled_from(["node1 slots=8", "10.0.0.11", "# a comment", "", "gpu[01-04] slots=2",
                     "n[1-100000000] slots=1", "a slots=0", "a slots=x", "a gpus=2", "a:",
                     "- a", "a slots=99999999999999999999999"]),
    st.text(alphabet="abn0123456789.-_=[] #:slots\t", max_size=30)), max_size=8).map("\n".join)


def _loads_or_refuses(path: Path) -> None:
    start = time.perf_counter()
    refused: Optional[str] = None
    try:
        inv: Optional[inventory.Inventory] = inventory.load(path)
    except InventoryError as exc:
        inv, refused = None, exc.message
    took = time.perf_counter() - start
    if inv is not None:
        assert inv.hosts and sum(h.master for h in inv.hosts) == 1
    else:
        assert refused and (str(path.parent) in refused or "INVENTORY" in refused), refused
    assert took < SECONDS, f"{took:.2f} s for {path.stat().st_size} bytes"


@FUZZ
@given(text=mutated(documents()))
def test_any_yaml_inventory_loads_or_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _loads_or_refuses(path)


@FUZZ
@given(text=HOSTFILES)
def test_any_hostfile_loads_or_is_refused(tmp_path: Path, text: str) -> None:
    """As INVENTORY itself, and as the `hostfile:` an inventory names."""
    direct = tmp_path / "hosts"
    direct.write_text(text)
    _loads_or_refuses(direct)
    (tmp_path / "hosts.txt").write_text(text)
    named = tmp_path / "inv.yaml"
    named.write_text("defaults:\n  nproc_per_node: 1\nhostfile: hosts.txt\n")
    _loads_or_refuses(named)


@FUZZ
@given(data=st.binary(max_size=300))
def test_any_bytes_load_or_are_refused(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(data)
    _loads_or_refuses(path)


def test_every_key_with_every_odd_value_loads_or_is_refused(tmp_path: Path) -> None:
    """Not left to chance: each odd value above in every key of a host, of `defaults:` and of
    the top level (one file each: the loader checks every key of a file in one pass)."""
    path = tmp_path / "inv.yaml"
    for value in ODD:
        host = "".join(f"    {k}: {value}\n" for k in HOST_KEYS[1:])
        defaults = "".join(f"  {k}: {value}\n" for k in HOST_KEYS[5:])
        top = "".join(f"{k}: {value}\n" for k in [*TOP_KEYS[1:3], TOP_KEYS[5], "master"])
        for text in (f"hosts:\n  - host: {value}\n",
                     f"hosts:\n  - host: localhost\n{host}",
                     f"defaults:\n{defaults}hosts:\n  - localhost\n",
                     f"{top}hosts:\n  - localhost\n",
                     f"hostfile: {value}\n", f"defaults: {value}\nhosts: {value}\n"):
            path.write_text(text)
            _loads_or_refuses(path)


_PROJECT = '[[package]]\nname = "x"\nversion = "1"\nsource = { editable = "." }\n'
BAD_UV_LOCKS = [
    "version = 1\nx = " + "[" * 3000,  # tomllib recurses
    "version = 1\npackage = 1\n",
    "version = 1\nrequires-python = 5\n" + _PROJECT,
    "version = 1\n" + _PROJECT.replace("{ editable = \".\" }", "5") + "dependencies = 1\n",
    "version = 1\n" + _PROJECT + "dependencies = [{name = \"y\", marker = 3}]\n",
    "version = 1\n" + _PROJECT + "dependencies = [{name = \"y\", marker = \"a >< 3\"}]\n"
    '[[package]]\nname = "y"\nversion = "2"\nsource = { registry = "x" }\nwheels = [{url = "x"}]\n',
    "version = 1\n" + _PROJECT + "dependencies = [{name = \"y\", extra = 3}]\n"
    '[[package]]\nname = "y"\nversion = 2\nsource = { registry = "x" }\nwheels = 3\n',
]


def test_a_malformed_uv_lock_is_refused(tmp_path: Path) -> None:
    """uv writes uv.lock, but one edited by hand or cut short may hold any TOML anywhere."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "1"\n')
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  - host: localhost\n    environment: proj\n")
    for text in BAD_UV_LOCKS:
        (tmp_path / "proj" / "uv.lock").write_text(text)
        with pytest.raises(InventoryError) as info:
            inventory.load(path)
        assert "uv.lock" in info.value.message, info.value.message


LOCK_PIECES = ["numpy", "==", "2.3.4", " @ ", "file://", "file:", "https://", "http://[::1",
               "%zz", "/x-1.0-py3-none-any.whl", "x-1.0.tar.gz", "#sha256=", "a" * 64, " ; ",
               ";", "python_version", " < ", '"3.12"', "'3.12'", " and ", "(", ")", "\\\n",
               " --hash=sha256:", " --", "-e ", "#", "\0", "\x85", "git+https://h/r", "[x]",
               "~", "..", " "]


# A requirement's parts, each from a few odd choices: most lines built from them look like pins
# or direct references, so that the code past the first check is what gets fuzzed.
LINE = st.tuples(st.sampled_from(["x", "numpy", "x[a]", "-e", "", "x.y_z"]),
                 st.sampled_from([" @ ", "==", "@", " @", "==="]),
                 st.sampled_from(["https://", "http://[::1", "file://", "file:", "git+https://",
                                  "file://%zz", "ftp://", "1.0", ""]),
                 st.sampled_from(["h", "u:p@h", "[::1]:8", "", "/tmp", ".."]),
                 st.sampled_from(["/x-1.0-py3-none-any.whl", "/x-1.0.tar.gz", "/y-1-a-b-c.whl",
                                  "/x%2F1.0-py3-none-any.whl", "/x-1.0-py3-none-any.whl%00",
                                  "", "/"]),
                 st.sampled_from(["", "#sha256=" + "a" * 64, "#md5=1", ";python_version<'3'",
                                  " ; python_version < '3'", " ; (((", " --hash=sha256:" + "b" * 64,
                                  " --hash=md5:1", " ; sys_platform == 'linux' --hash=sha256:"
                                  + "c" * 64])).map("".join)


@FUZZ
@given(st.lists(LINE, min_size=1, max_size=3)
       | st.lists(st.lists(st.sampled_from(LOCK_PIECES), max_size=12).map("".join), min_size=1,
                  max_size=5))
def test_a_requirements_lock_of_any_lines_loads_or_is_refused(tmp_path: Path,
                                                              lines: list[str]) -> None:
    """Direct references, markers and options in any order: read, or refused with the
    lock's line; never another exception."""
    (tmp_path / "req.lock").write_text("\n".join(lines) + "\n")
    path = tmp_path / "inv.yaml"
    path.write_text("defaults:\n  environment: req.lock\nhosts:\n  - localhost\n")
    _loads_or_refuses(path)


ODD_LINES = ["x @ http://[::1/x-1.0-py3-none-any.whl", "x @ file://%zz/x-1.0-py3-none-any.whl",
             "x @ file:x-1.0-py3-none-any.whl", "x==1 ; (((",
             'x @ https://h/x-1.0-py3-none-any.whl;python_version<"3"',
             "x @ file:///tmp/x-1.0-py3-none-any.whl%00", "x @ https://u:p@h/x-1.0-py3-none-any.whl",
             "x @ https://h/x%2F1.0-py3-none-any.whl", "x @ https://[::1]:99999/x-1-py3-none-any.whl",
             "x @ https://h/x-1.0-py3-none-any.whl#sha256=zz", "x @ \\\\share\\x.whl",
             "x @ file://" + "/a" * 3000 + "/x-1.0-py3-none-any.whl"]


def test_odd_direct_references_and_markers_load_or_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("defaults:\n  environment: req.lock\nhosts:\n  - localhost\n")
    for line in ODD_LINES:
        (tmp_path / "req.lock").write_text(line + "\n")
        _loads_or_refuses(path)


BAD_WHEELS = ['[{path = 3}]', '[{url = "http://[::1/x-1-py3-none-any.whl"}]', '[{url = 5}]',
              '[{path = "\\u0000"}]', '[{filename = "x.whl"}]', '[{hash = 7, url = "x"}]', "[3]"]


def test_a_uv_lock_with_odd_wheel_places_is_read_or_refused(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "pyproject.toml").write_text(
        '[project]\nname = "x"\nversion = "1"\n[[tool.uv.index]]\nname = 3\nurl = []\n')
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  - host: localhost\n    environment: proj\n")
    for registry in ('"../w"', '"https://[::1"', "5", '"file:///%zz"'):
        for listed in BAD_WHEELS:
            (tmp_path / "proj" / "uv.lock").write_text(
                "version = 1\n" + _PROJECT + 'dependencies = [{name = "y"}]\n'
                f'[[package]]\nname = "y"\nversion = "2"\nsource = {{ registry = {registry} }}\n'
                f"wheels = {listed}\n")
            _loads_or_refuses(path)
