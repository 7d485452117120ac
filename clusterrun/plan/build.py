"""Building the launch plan from the preflight report: decided before anything starts."""

from __future__ import annotations

import hashlib
import os
import re
import secrets as pysecrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

from clusterrun.errors import PreflightError, UsageError
from clusterrun.inventory import AUTO, Inventory
from clusterrun.plan import ranks
from clusterrun.plan.model import LaunchPlan, NodePlan
from clusterrun.preflight.report import CheckReport, HostReport

# What `stop`, `ps` and `logs -f` need to reach a run's hosts again, even if the inventory
# file has changed since.
CONNECTION_KEYS = ("host", "name", "user", "port", "identity_file", "known_hosts", "python",
                   "setup", "workdir")


def new_run_id(name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{name}-{pysecrets.token_hex(2)}"


def run_name(script: Path, name: Optional[str]) -> str:
    raw = name or script.stem
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.") or "run"
    return clean[:40]


def payload_dir(workdir: str, script_dir: Path) -> str:
    """Where a script's directory lives on a host: one copy per local directory, reused across
    launches so a re-launch moves only what changed."""
    digest = hashlib.sha256(str(script_dir.resolve()).encode()).hexdigest()[:10]
    return f"{workdir}/code/{script_dir.resolve().name or 'root'}-{digest}"


def parse_env(pairs: Sequence[str],
              environ: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """``--env NAME=VALUE``, or ``--env NAME`` for NAME's value in this machine's environment
    (``environ``, default os.environ), so a secret need not be typed on a command line."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"--env {pair!r}: expected NAME=VALUE, or NAME alone to pass on "
                             "its value here, with a valid variable name, e.g. --env "
                             "NCCL_DEBUG=INFO or --env HF_TOKEN.")
        if not sep:
            if key not in environ:
                raise UsageError(f"--env {key}: {key} is not set in this shell, so there is no "
                                 f"value to pass on; export it first, or give one with "
                                 f"--env {key}=VALUE.")
            value = environ[key]
        out[key] = value
    return out


def _nproc(host: HostReport, override: Optional[int]) -> int:
    if override is not None:
        return override
    value = host.spec.nproc_per_node
    if value != AUTO:
        return int(value)
    return host.gpus or 1


def _nccl_ifname(host: HostReport) -> str:
    """NCCL matches interface names by prefix (eth0 also matches eth01); `=name` is exact."""
    name = host.interface or ""
    others = [i["name"] for i in host.facts.get("interfaces", []) if i["name"] != name]
    return f"={name}" if any(o.startswith(name) for o in others) else name


def build(inv: Inventory, report: CheckReport, script: Path, args: Sequence[str], *,
          name: Optional[str] = None, nproc_override: Optional[int] = None,
          extra_env: Optional[dict[str, str]] = None, sync: bool = True, grace: float = 15.0,
          lease: float = 30.0, detach: bool = False) -> LaunchPlan:
    """Everything a launch will do, decided before anything starts."""
    if report.master_addr is None or report.master_port is None:
        raise PreflightError("cannot plan the launch: the master's address or port is unknown "
                             "(see the preflight report above).")
    label = run_name(script, name)
    run_id = new_run_id(label)
    hosts = sorted(report.hosts, key=lambda h: h.node_rank)
    nprocs = [_nproc(h, nproc_override) for h in hosts]
    starts = ranks.global_ranks(nprocs)
    nodes = []
    for host, nproc, span in zip(hosts, nprocs, starts):
        spec = host.spec
        workdir = host.workdir or spec.workdir
        rundir = f"{workdir}/runs/{run_id}/{spec.name}"
        if spec.local or not sync:
            cwd = str(script.parent.resolve())
        else:
            cwd = payload_dir(workdir, script.parent)
        remote_script = f"{cwd}/{script.name}"
        env = dict(spec.env_dict)
        env.update(extra_env or {})
        iface = host.interface or ""
        env.update({
            "NCCL_SOCKET_IFNAME": _nccl_ifname(host),
            "GLOO_SOCKET_IFNAME": iface,
            "CLUSTERRUN_RUN_ID": run_id,
            "CLUSTERRUN_NODE": spec.name,
            "CLUSTERRUN_NODE_RANK": str(host.node_rank),
            "PYTHONUNBUFFERED": "1",
        })
        if spec.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        argv = (
            spec.python, "-m", "torch.distributed.run",
            "--nnodes", str(len(hosts)), "--node-rank", str(host.node_rank),
            "--nproc-per-node", str(nproc),
            "--master-addr", report.master_addr, "--master-port", str(report.master_port),
            "--max-restarts", "0", "--log-dir", f"{rundir}/torchelastic",
            # Each rank runs under rank.sh, which sends its output to a file on this host.
            "--no-python", "/bin/sh", f"{rundir}/rank.sh",
            spec.python, "-u", remote_script, *args,
        )
        nodes.append(NodePlan(
            name=spec.name, host=spec.host, local=spec.local, node_rank=host.node_rank,
            nproc=nproc, first_rank=span.start, interface=iface, address=host.address or "",
            python=spec.python, setup=spec.setup, workdir=workdir, rundir=rundir, cwd=cwd,
            argv=argv, env=tuple(sorted(env.items())), connection=tuple(
                (key, getattr(spec, key)) for key in CONNECTION_KEYS)))
    return LaunchPlan(run_id=run_id, name=label, script=script, args=tuple(args),
                      master_addr=report.master_addr, master_port=report.master_port,
                      lifeline_port=report.lifeline_port,
                      nodes=tuple(nodes), sync=sync, grace=grace, lease=lease, detach=detach)


def script_path(raw: str) -> Path:
    path = Path(raw)
    if not path.is_file():
        raise UsageError(f"{raw}: no such script. Give the path of the training script on this "
                         "machine; clusterrun copies its directory to every host.")
    return Path(os.path.abspath(path))
