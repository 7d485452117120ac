"""The one place shell strings are built: whatever a value holds, a real shell sees it as one
literal word, and nothing in it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clusterrun.inventory import HostSpec
from clusterrun.transport import shell

HOSTILE = ["$(touch {marker})", "`touch {marker}`", "; touch {marker} #", "a'b\"c",
           "line1\nline2", "", "-rf", "λ→✓", "$HOME", "*", "\\", " spaced ", "|| touch {marker}"]


@pytest.mark.parametrize("sh", ["/bin/sh", "bash"])
def test_join_round_trips_through_a_real_shell(tmp_path: Path, sh: str) -> None:
    marker = tmp_path / "pwned"
    words = [w.format(marker=marker) for w in HOSTILE]
    script = shell.join([sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))",
                         *words])
    out = subprocess.run([sh, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == words
    assert not marker.exists()


def test_setup_runs_first_and_its_stdout_is_kept_off_the_program_output(tmp_path: Path) -> None:
    marker = tmp_path / "setup-ran"
    script = shell.with_setup(f"echo setup-noise; touch {marker}", "echo program")
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout == "program\n"
    assert "setup-noise" in out.stderr
    assert marker.exists()


def test_a_failing_setup_stops_with_its_own_exit_status() -> None:
    script = shell.with_setup("false", "echo should-not-run")
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=False)
    assert out.returncode == shell.SETUP_FAILED
    assert out.stdout == ""
    assert "setup: failed" in out.stderr


def test_remote_python_runs_the_shipped_program_from_stdin() -> None:
    cmd = shell.remote_python(HostSpec(host="localhost", name="n0", master=True, line=0,
                                       python=sys.executable))
    request = {"root": "/nonexistent-dir", "files": ["x"], "mkdir": False}
    out = subprocess.run(["/bin/sh", "-c", cmd], input=shell.program_input("files.py", request),
                         capture_output=True, check=True)
    reply = json.loads(out.stdout)
    assert reply == {"root": "/nonexistent-dir", "manifest": {}}
    assert "files.py" not in cmd and "manifest" not in cmd  # the program is not on argv



def _fake_engine(bin_dir: Path, name: str, log: Path) -> None:
    """An engine whose `exec -i [-u USER] CONTAINER ARGV...` records its arguments and runs
    ARGV here: enough to see what reaches the container, byte for byte."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' {name} \"$@\" > {log}\n"
        "shift 2\n"  # exec -i
        'if [ "$1" = -u ]; then shift 2; fi\n'
        "shift\n"  # the container
        'exec "$@"\n')
    tool.chmod(0o755)


def _container_spec(**kw: object) -> HostSpec:
    return HostSpec(host="gpu1", name="gpu1", master=True, line=0, python=sys.executable,
                    container="trainer", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("engines", "daemon", "used"), [
    (("docker", "podman"), True, "docker"),  # docker when its daemon can be there
    # A docker CLI alone is not an engine (unless this machine does run a docker daemon).
    (("docker", "podman"), False,
     "docker" if Path("/var/run/docker.sock").is_socket() else "podman"),
    (("podman",), False, "podman"),
])
def test_a_container_host_runs_the_program_in_the_engine_it_has(
        tmp_path: Path, engines: tuple[str, ...], daemon: bool, used: str) -> None:
    log = tmp_path / "argv"
    for engine in engines:
        _fake_engine(tmp_path / "bin", engine, log)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    if daemon:
        env["DOCKER_HOST"] = "unix:///run/user/1000/docker.sock"
    cmd = shell.remote_python(_container_spec(setup="export X=1", container_user="1000:1000"))
    request = {"root": "/nonexistent-dir", "files": [], "mkdir": False}
    out = subprocess.run(["/bin/sh", "-c", cmd], input=shell.program_input("files.py", request),
                         capture_output=True, check=True, env=env)
    assert json.loads(out.stdout)["root"] == "/nonexistent-dir"
    argv = log.read_text().splitlines()
    assert argv[:6] == [used, "exec", "-i", "-u", "1000:1000", "trainer"]
    assert argv[6:8] == ["bash", "-c"]  # setup: runs inside the container too


def test_a_container_host_without_an_engine_says_so(tmp_path: Path) -> None:
    cmd = shell.remote_python(_container_spec())
    out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, check=False,
                         env={"PATH": str(tmp_path)})
    assert out.returncode == shell.ENGINE_MISSING
    assert "neither docker nor podman" in out.stderr


def test_a_named_engine_is_used_as_named(tmp_path: Path) -> None:
    log = tmp_path / "argv"
    _fake_engine(tmp_path / "bin", "docker", log)
    _fake_engine(tmp_path / "bin", "podman", log)
    cmd = shell.run_there(_container_spec(container_engine="podman"), ["echo", "$(id)"])
    out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    assert out.stdout == "$(id)\n"
    assert log.read_text().splitlines() == ["podman", "exec", "-i", "trainer", "echo", "$(id)"]
