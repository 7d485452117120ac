"""`environment:` without a cluster: the lock read and refused line by line (exit 2, before any
SSH), which wheels fit which host, hosts grouped by platform, and drift named per package."""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from clusterrun import inventory
from clusterrun.envs import platforms, sync, verify
from clusterrun.envs.platforms import Platform
from clusterrun.envs.wheels import UV, Wheel
from clusterrun.errors import InventoryError, PreflightError
from tests.conftest import (
    LISTEN_HOST,
    REPO,
    clusterrun_argv,
    connection_attempted,
    run_cli,
    run_main,
)

SHA = "ab" * 32


def _inv(tmp_path: Path, lock: str, environment: str = "environment: req.lock") -> Path:
    (tmp_path / "req.lock").write_text(lock)
    path = tmp_path / "inv.yaml"
    path.write_text(f"defaults:\n  {environment}\nhosts:\n  - host: 10.0.0.1\n"
                    "  - host: 10.0.0.2\n")
    return path


def test_a_lock_of_pins_is_read_with_its_hashes(tmp_path: Path) -> None:
    lock = ("# pip freeze\nNumPy==2.3.4  # the array\n"
            f"typing_extensions==4.16.0 \\\n    --hash=sha256:{SHA}\ntorch==2.13.0+cpu\n")
    env = inventory.load(_inv(tmp_path, lock)).hosts[1].environment
    assert env is not None
    assert [(p.name, p.version, p.line) for p in env.pins] == [
        ("numpy", "2.3.4", 2), ("torch", "2.13.0+cpu", 5), ("typing-extensions", "4.16.0", 3)]
    assert env.pins[2].hashes == (SHA,)
    assert env.lock == str((tmp_path / "req.lock").resolve())


@pytest.mark.parametrize(("line", "words"), [
    ("numpy>=2", ("`numpy>=2` is not pinned", "NAME==VERSION")),
    ("numpy", ("`numpy` is not pinned",)),
    ("-e ./mypkg", ("an editable install", "pip wheel --no-deps ./mypkg")),
    ("--index-url https://x", ("`--index-url` options", "find_links")),
    ('numpy==2.3.4; python_version <<< "3.12"', ("its environment marker does not parse",)),
    ("mypkg @ file:///srv/src/mypkg", ("is not a wheel", "pip wheel --no-deps")),
    ("mypkg @ git+https://example.invalid/mypkg", ("is not a wheel (a git+https source)",)),
    ("numpy==2.3.4 --no-binary", ("only --hash=sha256",)),
])
def test_a_line_that_is_not_a_pin_is_refused_with_the_locks_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str,
        words: tuple[str, ...]) -> None:
    path = _inv(tmp_path, f"torch==2.13.0\n\n{line}\n")
    code, _out, err = run_main(capsys, "hosts", str(path))
    assert code == 2
    assert f"{(tmp_path / 'req.lock').resolve()}:3: " in err
    for word in words:
        assert word in err
    assert "Traceback" not in err


def test_a_pin_twice_and_an_empty_lock_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"req.lock:2: numpy is pinned twice .*line 1"):
        inventory.load(_inv(tmp_path, "numpy==2.3.4\nnumpy==2.3.5\n"))
    with pytest.raises(InventoryError, match=r"inv.yaml:2: environment: .* pins nothing"):
        inventory.load(_inv(tmp_path, "# nothing\n"))


def test_the_mapping_form_and_its_mistakes(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    good = inventory.load(_inv(tmp_path, "numpy==2.3.4\n", "environment: {lock: req.lock, "
                               "system_site_packages: true, find_links: [wheels], "
                               "index_url: 'file:///srv/simple'}"))
    env = good.hosts[0].environment
    assert env is not None and env.system_site_packages
    assert env.find_links == (str((tmp_path / "wheels").resolve()),)
    assert env.index_url == "file:///srv/simple"
    plain = inventory.load(_inv(tmp_path, "numpy==2.3.4\n")).hosts[0].environment
    assert plain is not None and plain.digest != env.digest  # what is built differs
    for text, words in [
        ("environment: {lock: req.lock, find_links: [nowhere]}", "find_links: 'nowhere'"),
        ("environment: {lock: req.lock, index_url: 'ftp://x'}", "index_url must be"),
        ("environment: {lock: req.lock, sites: true}", "unknown key `sites`"),
        ("environment: {system_site_packages: true}", "missing `lock:`"),
        ("environment: nope.lock", "no such file"),
        ("environment: proj/pyproject.toml", "needs its uv.lock beside pyproject.toml"),
    ]:
        (tmp_path / "proj").mkdir(exist_ok=True)
        with pytest.raises(InventoryError, match=r"inv.yaml:2: ") as found:
            inventory.load(_inv(tmp_path, "numpy==2.3.4\n", text))
        assert words in found.value.message


def test_a_bad_lock_is_refused_before_any_ssh(tmp_path: Path, listener: socket.socket,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "req.lock").write_text("numpy>=2\n")
    path = tmp_path / "inv.yaml"
    path.write_text(f"defaults:\n  environment: req.lock\nhosts:\n  - host: {LISTEN_HOST}\n"
                    f"    port: {listener.getsockname()[1]}\n")
    code, _out, err = run_main(capsys, "env", str(path))
    assert code == 2 and "req.lock:1:" in err
    assert not connection_attempted(listener)


def test_platform_tags_cover_every_older_manylinux() -> None:
    tags = Platform("3.11", "x86_64", (2, 36)).tags()
    assert tags[0] == "manylinux_2_36_x86_64"
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                "manylinux2010_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"):
        assert tag in tags
    arm = Platform("3.12", "aarch64", (2, 31)).tags()
    assert "manylinux2014_aarch64" in arm and not any("manylinux1" in t for t in arm)
    assert "manylinux_2_32_aarch64" not in arm
    args = Platform("3.12", "aarch64", (2, 31)).pip_args()
    assert args[args.index("--python-version") + 1] == "3.12" and "--no-deps" in args


def _status(python: str = "3.11.2", machine: str = "x86_64", libc: str = "glibc 2.36",
            **more: Any) -> dict[str, Any]:
    return {"python": python, "machine": machine, "libc": libc, "system": "Linux",
            "workdir": "/w", **more}


def test_a_host_that_is_not_glibc_linux_is_refused_by_name() -> None:
    assert platforms.from_status("a", _status()) == Platform("3.11", "x86_64", (2, 36), "3.11.2")
    with pytest.raises(platforms.PlatformError, match="b: `environment:` needs a glibc"):
        platforms.from_status("b", _status(libc=None))


def test_hosts_are_grouped_by_platform_and_wheels_gathered_once_per_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "req.lock").write_text("numpy==2.3.4\n")
    inv = inventory.load(_inv(tmp_path, "numpy==2.3.4\n"))
    asked: list[tuple[Platform, list[str]]] = []

    def resolve(_cache: Any, _env: Any, platform: Platform, hosts: list[str]) -> list[Wheel]:
        asked.append((platform, hosts))
        return [Wheel("numpy", "2.3.4", "numpy.whl", SHA, 1), Wheel(UV.name, UV.version,
                                                                    "uv.whl", SHA, 1)]

    monkeypatch.setattr("clusterrun.envs.wheels.resolve", resolve)
    worker = sync.Sync(inv, None, tmp_path)  # type: ignore[arg-type]  # no host is asked
    statuses = [_status(env={"python": "3.11.2", "dists": ["numpy==2.3.4"]}),
                _status(python="3.12.1")]
    for host, status in zip(worker.hosts, statuses):
        host.status, host.platform = status, platforms.from_status(host.spec.name, status)
    worker.resolve()
    assert [a[0].python for a in asked] == ["3.11", "3.12"]
    assert [h.state for h in worker.hosts] == [sync.READY, sync.MISSING]

    # No wheel for one platform: its hosts fail with the reason, the others go on.
    def no_wheel(cache: Any, env: Any, platform: Platform, hosts: list[str]) -> list[Wheel]:
        if platform.python == "3.12":
            raise PreflightError(f"no wheel of numpy==2.3.4 for {platform.label}")
        return resolve(cache, env, platform, hosts)

    monkeypatch.setattr("clusterrun.envs.wheels.resolve", no_wheel)
    worker.resolve()
    assert [h.state for h in worker.hosts] == [sync.READY, sync.FAILED]
    assert worker.hosts[1].problem == "no wheel of numpy==2.3.4 for cp312 manylinux x86_64 " \
        "(glibc 2.36)"


def test_drift_is_named_package_by_package() -> None:
    found = {"python": "3.11.2", "dists": ["numpy==2.4.0", "six==1.16.0"]}
    assert sync.differences(["numpy==2.3.4", "torch==2.13.0+cpu"], "3.11.2", found) == [
        "numpy 2.4.0 instead of 2.3.4", "six==1.16.0 not in the lock", "torch==2.13.0+cpu missing"]
    assert sync.differences(["numpy==2.3.4"], "3.11.7", {"python": "3.11.2",
                                                          "dists": ["numpy==2.3.4"]}) == [
        "built for Python 3.11.2, the host's is 3.11.7"]
    assert sync.differences(["numpy==2.3.4"], "3.11.2", None) == ["not built"]
    assert verify.env_hash(found) != verify.env_hash({**found, "python": "3.11.3"})


def test_a_host_that_cannot_be_reached_is_named_with_exit_4(
        tmp_path: Path, listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "req.lock").write_text("numpy==2.3.4\n")
    (tmp_path / "known_hosts").write_text("")
    path = tmp_path / "inv.yaml"
    path.write_text(f"defaults:\n  environment: req.lock\n  known_hosts: {tmp_path}/known_hosts\n"
                    f"hosts:\n  - host: {LISTEN_HOST}\n    name: far\n"
                    f"    port: {listener.getsockname()[1]}\n")
    code, out, err = run_main(capsys, "env", "--connect-timeout", "0.5", str(path))
    assert code == 4 and out == ""  # what failed is said on stderr
    assert err.startswith("far (") and "no SSH answer" in err


def test_ps_shows_the_lock_a_run_ran_in(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from clusterrun.runs import store

    for run_id, extra in (("20260301-120000-envs-0001", {"environment": "3f2a9c0e1d2b4a5c"}),
                          ("20260301-110000-plain-0002", {})):
        run = store.create(home, run_id)
        (run.path / "plan.json").write_text(json.dumps({"name": "x", "created": 1.0,
                                                        "nodes": [{"name": "n1"}], **extra}))
        (run.path / "state.json").write_text(json.dumps({"state": "succeeded", "started_at": 1.0,
                                                         "ended_at": 2.0, "exit_status": 0}))
    code, out, err = run_main(capsys, "ps", "--json", "--local")
    assert code == 0, err
    assert [row["environment"] for row in json.loads(out)] == ["3f2a9c0e1d2b4a5c", None]
    code, out, err = run_main(capsys, "ps", "--local")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[2] == "  environment: 3f2a9c0e1d2b4a5c"
    assert lines[1].startswith("20260301-120000-envs-0001") and lines[3].startswith("20260301-11")


def local_inventory(tmp_path: Path, hosts: int = 1) -> Path:
    """Local hosts (no SSH) whose environment is the tiny wheel's."""
    from tests.envtools import tiny_wheel

    tiny_wheel(tmp_path / "wheels")
    (tmp_path / "req.lock").write_text("clusterrun-tinypkg==0.1\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text("defaults:\n  environment: {lock: req.lock, find_links: [wheels]}\nhosts:\n"
                   + "".join(f"  - host: localhost\n    name: n{k}\n" for k in range(hosts)))
    return inv


@pytest.mark.slow  # pip gathers uv's wheel (from the configured local index) and uv builds
def test_env_check_and_check_json_on_this_machine(home: Path, tmp_path: Path) -> None:
    """Local hosts (no SSH): `env --check` exits 3 while a host's environment is missing or
    differs and 0 once it is the lock's; `check --json` prints one JSON object either way."""
    inv = local_inventory(tmp_path)

    def env(*args: str) -> tuple[int, dict[str, Any]]:
        cp = run_cli("env", "--json", *args, str(inv), timeout=300)
        return cp.returncode, json.loads(cp.stdout or "{}")

    def check() -> tuple[int, dict[str, Any]]:
        cp = run_cli("check", "--json", str(inv), timeout=300)
        return cp.returncode, json.loads(cp.stdout or "{}")

    code, found = env("--check")
    assert code == 3 and [h["state"] for h in found["hosts"]] == ["missing"]
    code, report = check()
    assert code == 3 and report["ok"] is False
    [host] = report["hosts"]
    assert host["name"] == "n0" and host["checks"][0]["name"] == "environment"
    assert "not built yet" in host["checks"][0]["detail"]
    assert report["environment"]["hosts"][0]["state"] == "missing"
    plain = run_cli("check", str(inv), timeout=300)
    assert plain.returncode == 3
    assert f"not built yet on n0. `clusterrun env {inv}` builds it there" in plain.stderr

    code, found = env()
    assert code == 0 and [h["state"] for h in found["hosts"]] == ["built"]
    code, found = env("--check")
    assert code == 0 and [h["state"] for h in found["hosts"]] == ["ready"]
    path = Path(found["hosts"][0]["path"])
    plain = run_cli("check", str(inv), timeout=300)  # after its table: each host's environment
    assert f"n0: {path}  ready (the lock's, nothing moved)" in plain.stdout, plain.stdout
    next(path.glob("lib/python3*/site-packages")).joinpath("handmade-1.0.dist-info").mkdir()
    code, found = env("--check")
    assert code == 3 and found["hosts"][0]["drift"] == ["handmade==1.0 not in the lock"]
    plain = run_cli("env", "--check", str(inv), timeout=300)
    assert plain.returncode == 3
    assert f"The environment on n0 differs from the lock. `clusterrun env {inv}` builds it" \
        in plain.stderr
    code, report = check()
    assert code == 3 and "handmade==1.0 not in the lock" in report["hosts"][0]["checks"][0][
        "detail"]


@pytest.mark.slow
@pytest.mark.usefixtures("home")
def test_env_draws_a_bar_per_host_on_a_terminal_only(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, hosts=2)
    leader, follower = pty.openpty()
    with subprocess.Popen(clusterrun_argv("env", str(inv)), stdout=subprocess.PIPE,
                          stderr=follower, env={**os.environ, "TERM": "xterm", "COLUMNS": "120"},
                          cwd=REPO) as proc:
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the command ended and closed its end
                break
            if not chunk:
                break
            drawn += chunk
        out = proc.stdout.read().decode() if proc.stdout else ""
    os.close(leader)
    assert proc.returncode == 0, drawn.decode(errors="replace")
    screen = drawn.decode(errors="replace")
    assert "━" in screen and "n0" in screen and "n1" in screen  # a bar for each host
    assert [line.split(":")[0] for line in out.splitlines()[:2]] == ["n0", "n1"]
    plain = run_cli("env", str(inv), timeout=300)  # not a terminal: plain lines, no bars
    assert plain.returncode == 0, plain.stderr
    assert "━" not in plain.stderr and "ready" in plain.stdout


@pytest.mark.slow
def test_a_ready_environment_answers_from_its_own_interpreter_and_keeps_it_for_the_probe(
        home: Path, tmp_path: Path) -> None:
    """A warm launch's status comes from the environment's interpreter (its workdir known),
    which then waits on the connection for the command's next program: that program runs in
    the environment with no new channel and no base interpreter to end first."""
    from clusterrun.transport import SshOptions, programs
    from clusterrun.transport.pool import Connections

    inv_path = local_inventory(tmp_path)
    built = run_cli("env", str(inv_path), timeout=300)
    assert built.returncode == 0, built.stderr
    inv = inventory.load(inv_path)
    with Connections(SshOptions()) as pool:
        report = sync.sync(inv, pool, home)
        [host] = report.hosts
        assert (host.state, host.in_env) == (sync.READY, True)
        spec = report.inventory(inv).hosts[0]
        assert len(programs._parked[pool.get(spec)]) == 1
        reply = programs.call(pool.get(spec), spec, "pyenv.py",
                              {"op": "status", "workdir": spec.workdir, "lock": "x"}, 30)
        assert reply["python_path"] == host.python
    with Connections(SshOptions()) as pool:  # `env` itself leaves nothing parked
        report = sync.Sync(inv, pool, home).run(build=False)
        assert report.hosts[0].in_env and not programs._parked.get(pool.get(inv.hosts[0]))


@pytest.mark.slow
def test_a_warm_launch_asks_no_status_and_a_cold_or_drifted_one_asks_it_as_before(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every host's workdir known: preflight's probe runs in the environment's interpreter and
    reports the environment, and a host whose environment is the lock's gets no status call.
    One that differs, or whose environment is gone, is asked its status as without this (the
    same lines), and the launch goes on from there."""
    from clusterrun.envs.sync import Sync

    inv = local_inventory(tmp_path, hosts=2)
    inv.write_text(inv.read_text().replace("defaults:\n", f"defaults:\n  workdir: {tmp_path}/wd\n"))
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    built = run_cli("env", str(inv), timeout=300)
    assert built.returncode == 0, built.stderr
    asked: list[str] = []
    status = Sync._status

    def counted(self: Sync, host: sync.HostEnv) -> dict[str, Any]:
        asked.append(host.spec.name)
        return status(self, host)

    monkeypatch.setattr(Sync, "_status", counted)

    def dry_run(expect: int = 0) -> str:
        asked.clear()
        code, out, err = run_main(capsys, "launch", "--dry-run", "--no-check", str(inv),
                                  str(script))
        assert code == expect, err
        return out + err

    out = dry_run()
    [path] = {line.split()[1] for line in out.splitlines() if line.startswith("n0: ")}
    assert path.startswith(f"{tmp_path}/wd/envs/")
    assert f"{path}/bin/python" in out  # the ranks run the environment's interpreter
    assert asked == []
    assert f"n0: {path}  ready" in out and f"n1: {path}  ready" in out

    site = next(Path(path).glob("lib/python3*/site-packages"))
    (site / "handmade-1.0.dist-info").mkdir()
    out = dry_run()
    assert sorted(asked) == ["n0", "n1"]
    assert f"n0: {path}  differs from the lock: handmade==1.0 not in the lock" in out
    # A launch rebuilds it (as it always did), then runs in it.
    script.write_text("import sys\nprint('prefix', sys.prefix)\n")
    asked.clear()
    code, out, err = run_main(capsys, "launch", "--no-check", "--no-torchrun", str(inv),
                              str(script))
    assert code == 0, err
    assert sorted(asked) == ["n0", "n1"] and "building on" in err
    assert f"prefix {path}" in out and not (site / "handmade-1.0.dist-info").exists()
    asked.clear()
    assert "ready" in dry_run() and asked == []

    subprocess.run(["rm", "-r", path], check=True)
    # A dry run builds nothing: preflight then finds no interpreter there, as it always did.
    out = dry_run(expect=3)
    assert sorted(asked) == ["n0", "n1"] and f"`{path}/bin/python` was not found" in out


# A stand-in uv (a shell script in a wheel, as uv's binary is): `venv` makes a venv of the
# `--python` given, `pip install` a dist-info per line of the lock (its name as wheels write it)
# and one the lock never named.
INTRUDING_UV = r"""#!/bin/sh
last() { for a in "$@"; do :; done; echo "$a"; }
after() {
  flag=$1; shift; prev=
  for a in "$@"; do [ "$prev" = "$flag" ] && echo "$a"; prev=$a; done
}
if [ "$1" = venv ]; then
  py=$(after --python "$@"); dir=$(last "$@")
  mkdir -p "$dir/bin" "$dir/lib/python3/site-packages"
  ln -s "$py" "$dir/bin/python"
  printf 'home = %s\nversion_info = %s\n' "$(dirname "$py")" \
    "$("$py" -c 'import platform; print(platform.python_version())')" > "$dir/pyvenv.cfg"
  exit 0
fi
env=$(dirname "$(dirname "$(after --python "$@")")")
while read -r spec rest; do
  name=$(echo "${spec%%==*}" | tr - _)
  mkdir "$env/lib/python3/site-packages/$name-${spec#*==}.dist-info"
done < "$(after -r "$@")"
mkdir "$env/lib/python3/site-packages/intruder-1.0.dist-info"
"""


def test_launch_rebuilds_a_drifted_host_and_refuses_one_that_still_differs(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch builds the host's environment; what the build leaves differing from the lock
    (here uv installs a package the lock never named) stops it with exit 3, naming the host and
    the package, and nothing is started."""
    import zipfile

    from clusterrun.envs import wheels
    from tests.envtools import tiny_wheel

    tiny = tiny_wheel(tmp_path / "wheels")
    fake_uv = tmp_path / f"uv-{UV.version}-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(fake_uv, "w") as archive:
        archive.writestr(f"uv-{UV.version}.data/scripts/uv", INTRUDING_UV)

    def resolve(cache: wheels.Cache, _env: Any, _platform: Platform,
                _hosts: list[str]) -> list[Wheel]:
        found = []
        for path, pin in ((tiny, "clusterrun-tinypkg"), (fake_uv, UV.name)):
            name, version = wheels.parse_filename(path.name)
            item = Wheel(name, version, path.name, wheels.sha256_of(path), path.stat().st_size)
            cache.path(item).parent.mkdir(parents=True, exist_ok=True)
            cache.path(item).write_bytes(path.read_bytes())
            assert item.name == pin
            found.append(item)
        return found

    monkeypatch.setattr("clusterrun.envs.wheels.resolve", resolve)
    (tmp_path / "req.lock").write_text("clusterrun-tinypkg==0.1\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"defaults:\n  environment: req.lock\n  workdir: {tmp_path}/wd\nhosts:\n"
                   "  - host: localhost\n    name: n0\n")
    script = tmp_path / "hello.py"
    script.write_text(f"open({str(tmp_path / 'started')!r}, 'w').write('yes')\n")
    code, _out, err = run_main(capsys, "launch", "--no-check", "--no-torchrun", str(inv),
                               str(script))
    assert code == 3, err
    assert "building on 1 of 1 host(s)" in err  # it was rebuilt first
    assert "n0: its environment " in err and " still differs from the lock " in err
    assert "after it was built there: intruder==1.0 not in the lock." in err
    assert "Traceback" not in err
    assert not (tmp_path / "started").exists()  # the job never ran
    env = next((tmp_path / "wd" / "envs").glob("[0-9a-f]*"))
    assert (env / "lib/python3/site-packages/intruder-1.0.dist-info").is_dir()


@pytest.mark.slow  # pip gathers uv's wheel (from the configured local index) and uv builds
@pytest.mark.usefixtures("home")
def test_env_prune_keeps_the_current_and_the_previous_environment(tmp_path: Path) -> None:
    """Three locks built one after the other (what is built differs: system_site_packages, a
    hash); `env --prune` with the third removes the first and keeps the second and third."""
    from clusterrun.envs.wheels import sha256_of

    inv = local_inventory(tmp_path)
    sha = sha256_of(tmp_path / "wheels" / "clusterrun_tinypkg-0.1-py3-none-any.whl")
    base = inv.read_text().replace("defaults:\n", f"defaults:\n  workdir: {tmp_path}/wd\n")
    built = []
    for lock, site in (("clusterrun-tinypkg==0.1\n", "false"), ("clusterrun-tinypkg==0.1\n",
                                                                 "true"),
                       (f"clusterrun-tinypkg==0.1 --hash=sha256:{sha}\n", "false")):
        (tmp_path / "req.lock").write_text(lock)
        inv.write_text(base.replace("find_links:", f"system_site_packages: {site}, find_links:"))
        cp = run_cli("env", "--json", str(inv), timeout=300)
        assert cp.returncode == 0, cp.stderr
        [host] = json.loads(cp.stdout)["hosts"]
        assert host["state"] == "built"
        built.append(host["lock"])
    assert len(set(built)) == 3
    envs = tmp_path / "wd" / "envs"
    assert sorted(p.name for p in envs.iterdir() if not p.name.startswith(".")) == sorted(built)
    cp = run_cli("env", "--prune", str(inv), timeout=300)
    assert cp.returncode == 0, cp.stderr
    assert f"n0: removed {built[0]}" in cp.stdout + cp.stderr
    assert sorted(p.name for p in envs.iterdir() if not p.name.startswith(".")) == sorted(
        built[1:])
