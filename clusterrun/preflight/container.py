"""Before the probe on a host with `container:`: is there an engine this user may use, does the
container exist and run, and does it have Python? Asked on the host itself (outside the
container) with one short shell script (shell.CONTAINER_CHECK), so each answer names its own fix."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

from clusterrun.errors import Outcome
from clusterrun.inventory import HostSpec
from clusterrun.transport import shell
from clusterrun.transport.base import Transport
from clusterrun.transport.programs import ProgramError, drain

RUN_EXAMPLE = {
    "docker": "docker run -d --name {name} --network host --ipc host --gpus all IMAGE "
              "sleep infinity",
    "podman": "podman run -d --name {name} --network host --ipc host "
              "--device nvidia.com/gpu=all IMAGE sleep infinity",
}


@dataclass(frozen=True)
class Found:
    """What the host said about its container; ``problem`` is None when it is usable."""

    engine: Optional[str]
    state: Optional[str] = None
    python: Optional[str] = None
    problem: Optional[str] = None


def judge(spec: HostSpec, output: str) -> Found:
    """Read shell.CONTAINER_CHECK's output; say what is wrong, with the fix, naming the host."""
    fields: dict[str, str] = {}
    details: list[str] = []
    for line in output.splitlines():
        key, _, value = line.partition("=")
        if key == "detail":
            details.append(value.strip())
        elif key:
            fields[key] = value.strip()
    engine = fields.get("engine") or None
    said = " | ".join(d for d in details if d)
    name, host = spec.container, spec.name
    error = fields.get("error")

    def found(problem: Optional[str] = None) -> Found:
        return Found(engine, fields.get("state"), fields.get("python"), problem)

    if error == "missing":
        which = f"{spec.container_engine} is" if spec.container_engine else \
            "neither docker nor podman is"
        return found(f"{host}: `container: {name}` needs a container engine, and {which} "
                     "installed there (not on the PATH of a non-interactive SSH session). "
                     "Install it, or set `container_engine:` to the one the host has.")
    if error == "inspect":
        low = said.lower()
        if "permission denied" in low:
            who = f"user {spec.user}" if spec.user else "the SSH user"
            return found(f"{host}: {who} may not use {engine} "
                         f"there ({said}). Add the user to the docker group (`sudo usermod -aG "
                         "docker USER`, then log in again), or set `user:` to one that may.")
        if "cannot connect" in low or "is the docker daemon running" in low:
            return found(f"{host}: {engine} is installed but its daemon does not answer "
                         f"({said}). Start it (`sudo systemctl start {engine}`).")
        if "no such" in low:
            example = RUN_EXAMPLE.get(engine or "docker", RUN_EXAMPLE["docker"])
            return found(f"{host}: there is no container {name!r} ({engine}). Start it first, "
                         f"e.g. `{example.format(name=name)}`; clusterrun runs in existing "
                         "containers and never creates or removes them (docs/containers.md).")
        return found(f"{host}: `{engine} inspect {name}` failed: {said or 'no output'}.")
    state = fields.get("state")
    if state is not None and state != "running":
        verb = "unpause" if state == "paused" else "start"
        return found(f"{host}: container {name!r} is {state}, not running. Start it with "
                     f"`{engine} {verb} {name}` (clusterrun never starts or creates "
                     "containers).")
    if error == "python":
        return found(f"{host}: container {name!r} has no usable `{spec.python}` ({said}). "
                     "Use an image with Python 3 and torch, or set `python:` to the "
                     "container's interpreter.")
    if state is None:
        return found(f"{host}: no answer about container {name!r}: {output.strip()[-300:]!r}.")
    return found()


def check(transport: Transport, spec: HostSpec, timeout: float) -> Found:
    """Ask the host (outside the container). Raises ProgramError when it gives no answer."""
    proc = transport.run(shell.container_check(spec))
    _thread, stderr = drain(proc)
    out = bytearray()
    done = threading.Event()

    def read() -> None:
        try:
            while chunk := proc.recv(65536):
                out.extend(chunk)
        except OSError:
            pass
        done.set()

    threading.Thread(target=read, daemon=True, name="clusterrun-container-check").start()
    proc.close_stdin()
    finished = done.wait(timeout)
    proc.close()
    if not finished:
        raise ProgramError(Outcome.PROBE_TIMEOUT,
                           f"{spec.name}: asking {spec.container_engine or 'the engine'} about "
                           f"container {spec.container!r} gave no answer within {timeout:g} s.")
    text = out.decode("utf-8", "replace")
    if "engine=" not in text:
        err = stderr.decode("utf-8", "replace").strip()[-300:]
        raise ProgramError(Outcome.PROBE_FAILED,
                           f"{spec.name}: checking container {spec.container!r} failed: "
                           f"{err or 'no output'}.")
    return judge(spec, text)
