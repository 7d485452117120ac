"""Building the launch plan from the preflight report: decided before anything starts."""

from __future__ import annotations

import hashlib
import os
import re
import secrets as pysecrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from clusterrun.errors import PreflightError, UsageError
from clusterrun.inventory import HostSpec, Inventory, ranks
from clusterrun.inventory.hosts import CPU, GPU
from clusterrun.plan import environment, placeholders
from clusterrun.plan.model import Job, LaunchPlan, NodePlan, RankProcess
from clusterrun.preflight.report import CheckReport, HostReport
from clusterrun.remote.shared import layout, protocol

# What `stop`, `ps` and `logs -f` need to reach a run's hosts again, even if the inventory
# file has changed since.
CONNECTION_KEYS = ("host", "name", "user", "port", "identity_file", "known_hosts", "python",
                   "setup", "workdir", "container", "container_engine", "container_user",
                   "proxy_jump", "transport", "slurm_job")


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


def _nprocs(hosts: Sequence[HostReport], override: Optional[int]) -> list[int]:
    """Each host's process count; refused, naming the hosts, where `gpu` finds no GPU or `cpu`
    no CPU count (torchrun would refuse it on that host, after the others had started)."""
    if override is not None:
        return [override] * len(hosts)
    found = [h.nproc for h in hosts]
    for word, said in ((GPU, "no GPU that nvidia-smi sees on {}: leave it out with -x, or give"),
                       (CPU, "no CPU count reported by {} (an older probe): give")):
        lacking = [h.spec.name for h, n in zip(hosts, found)
                   if n is None and h.spec.nproc_per_node == word]
        if lacking:
            from clusterrun.inventory.ranges import fold

            raise PreflightError(f"nproc_per_node {word}: {said.format(fold(lacking))} a number "
                                 "of processes (--nproc-per-node N, or `nproc_per_node:` for "
                                 "that host).")
    return [n or 1 for n in found]


def _nccl_ifname(host: HostReport) -> str:
    """NCCL matches interface names by prefix (eth0 also matches eth01); `=name` is exact."""
    name = host.interface or ""
    others = [i.name for i in host.known.interfaces if i.name != name]
    return f"={name}" if any(o.startswith(name) for o in others) else name


@dataclass(frozen=True)
class EnvSources:
    """Where the ranks' environment comes from, besides the inventory's `env:` (runs.environment
    documents the order)."""

    extra: Mapping[str, str] = field(default_factory=dict)  # --env, wins over everything
    env_file: Optional[Path] = None  # --env-file (else each host's `env_file:`)
    forward: tuple[str, ...] = ()  # --forward-env globs (with each host's `forward_env:`)
    environ: Optional[Mapping[str, str]] = None  # this shell's environment (default os.environ)


def _rank_env(spec: HostSpec, sources: EnvSources,
              files: dict[str, dict[str, str]]) -> dict[str, str]:
    environ = os.environ if sources.environ is None else sources.environ
    path = str(sources.env_file) if sources.env_file is not None else spec.env_file
    if path is not None and path not in files:
        files[path] = environment.read_env_file(Path(path))
    return environment.merge([
        environment.forwarded(environ, (*sources.forward, *spec.forward_env)),
        files.get(path, {}) if path is not None else {},
        spec.env_dict,
        sources.extra,
    ])


def code_paths(spec: HostSpec, workdir: str, job: Job, sync: bool) -> tuple[str, str]:
    """(the ranks' cwd, where the code is copied when that is not the cwd itself: "")."""
    local_code = job.code.resolve()
    if spec.own_files or not sync:
        return str(local_code.parent if job.module and job.script.is_dir() else local_code), ""
    cwd = payload_dir(workdir, local_code)
    if job.module is not None and job.script.is_dir():
        # `python -m pkg.train` needs the directory that holds pkg/ as its cwd.
        return cwd, f"{cwd}/{local_code.name}"
    return cwd, ""


def _command(spec: HostSpec, job: Job, cwd: str) -> list[str]:
    """How the host's interpreter runs the job: ``python -u script`` or ``python -u -m module``."""
    target = ["-m", job.module] if job.module is not None else [f"{cwd}/{job.script.name}"]
    return [spec.python, "-u", *target]


def build(inv: Inventory, report: CheckReport, job: Job, *, name: Optional[str] = None,
          nproc_override: Optional[int] = None, env: Optional[EnvSources] = None,
          sync: bool = True, grace: float = protocol.GRACE, lease: float = protocol.LEASE,
          detach: bool = False, run_id: Optional[str] = None, attempt: int = 1,
          max_restarts: int = 0, stall: tuple[float, str] = (0.0, "report")) -> LaunchPlan:
    """Everything a launch will do, decided before anything starts. A restart (``attempt`` 2
    and on) keeps the run's id; its files on each host go to a folder of their own."""
    if report.master_addr is None or report.master_port is None:
        raise PreflightError("cannot plan the launch: the master's address or port is unknown "
                             "(see the preflight report above).")
    placeholders.check(job.args, per_process=not job.torchrun)
    label = run_name(job.script, name or job.label)
    run_id = run_id or new_run_id(label)
    restarts = attempt - 1
    hosts = sorted(report.hosts, key=lambda h: h.node_rank)
    nprocs = _nprocs(hosts, nproc_override)
    starts = ranks.global_ranks(nprocs)
    world = sum(nprocs)
    files: dict[str, dict[str, str]] = {}
    nodes = []
    for host, nproc, span in zip(hosts, nprocs, starts):
        spec = host.spec
        workdir = host.workdir or spec.workdir
        rundir = layout.rundir(workdir, run_id, attempt, spec.name)
        cwd, code_dest = code_paths(spec, workdir, job, sync)
        values: dict[str, object] = {
            "node_rank": host.node_rank, "nnodes": len(hosts),
            "master_addr": report.master_addr, "master_port": report.master_port}
        node_env = _rank_env(spec, env or EnvSources(), files)
        node_env.update(environment.nccl_debug(node_env, rundir))
        node_env.update(environment.flight_recorder(node_env, rundir, bool(host.gpus)))
        iface = host.interface or ""
        node_env.update({
            "NCCL_SOCKET_IFNAME": _nccl_ifname(host),
            "GLOO_SOCKET_IFNAME": iface,
            "CLUSTERRUN_RUN_ID": run_id,
            "CLUSTERRUN_NODE": spec.name,
            "CLUSTERRUN_NODE_RANK": str(host.node_rank),
            "CLUSTERRUN_RESTART_COUNT": str(restarts),
            "PYTHONUNBUFFERED": "1",
        })
        if spec.gpus is not None:
            node_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        command = _command(spec, job, cwd)
        argv: tuple[str, ...] = ()
        processes: tuple[RankProcess, ...] = ()
        if job.torchrun:
            if job.local_rank_arg:  # rank.sh puts --local_rank=N before the script's arguments
                node_env["CLUSTERRUN_LOCAL_RANK_AT"] = str(len(command))
            argv = (
                spec.python, "-m", "torch.distributed.run",
                "--nnodes", str(len(hosts)), "--node-rank", str(host.node_rank),
                "--nproc-per-node", str(nproc),
                "--master-addr", report.master_addr, "--master-port", str(report.master_port),
                "--max-restarts", "0", "--log-dir", f"{rundir}/torchelastic",
                *job.torchrun_args,
                # Each rank runs under rank.sh, which sends its output to a file on this host.
                "--no-python", "/bin/sh", f"{rundir}/rank.sh",
                *command, *(placeholders.expand(a, values) for a in job.args),
            )
        else:
            processes = tuple(_process(command, job, values, node_rank=host.node_rank,
                                       rank=span.start + i, local_rank=i, nproc=nproc,
                                       world=world, run_id=run_id,
                                       restarts=(restarts, max_restarts)) for i in range(nproc))
        nodes.append(NodePlan(
            name=spec.name, host=spec.host, local=spec.own_files, node_rank=host.node_rank,
            nproc=nproc, first_rank=span.start, interface=iface, address=host.address or "",
            python=spec.python, setup=spec.setup, workdir=workdir, rundir=rundir, cwd=cwd,
            argv=argv, env=tuple(sorted(node_env.items())), code_dest=code_dest,
            processes=processes, connection=tuple(
                (key, getattr(spec, key)) for key in CONNECTION_KEYS)))
    return LaunchPlan(run_id=run_id, name=label, script=job.script, args=tuple(job.args),
                      master_addr=report.master_addr, master_port=report.master_port,
                      lifeline_port=report.lifeline_port, module=job.module, code=job.code,
                      nodes=tuple(nodes), sync=sync, grace=grace, lease=lease, detach=detach,
                      attempt=attempt, stall_timeout=stall[0], on_stall=stall[1])


def _process(command: list[str], job: Job, values: dict[str, object], *, node_rank: int,
             rank: int, local_rank: int, nproc: int, world: int, run_id: str,
             restarts: tuple[int, int] = (0, 0)) -> RankProcess:
    """One process started without torchrun: the environment torchrun would give it, and its
    arguments with every placeholder expanded in one pass."""
    mine = dict(values, rank=rank, local_rank=local_rank, world_size=world)
    argv = [*command, *([f"--local_rank={local_rank}"] if job.local_rank_arg else []),
            *(placeholders.expand(a, mine) for a in job.args)]
    env = {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world,
           "LOCAL_WORLD_SIZE": nproc, "GROUP_RANK": node_rank, "NODE_RANK": node_rank,
           "ROLE_RANK": rank, "ROLE_WORLD_SIZE": world, "MASTER_ADDR": values["master_addr"],
           "MASTER_PORT": values["master_port"], "TORCHELASTIC_RESTART_COUNT": restarts[0],
           "TORCHELASTIC_MAX_RESTARTS": restarts[1], "TORCHELASTIC_RUN_ID": run_id}
    return RankProcess(tuple(argv), tuple((k, str(v)) for k, v in env.items()))


def script_path(raw: str) -> Path:
    path = Path(raw)
    if not path.is_file():
        raise UsageError(f"{raw}: no such script. Give the path of the training script on this "
                         "machine; clusterrun copies its directory to every host.")
    return Path(os.path.abspath(path))


_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def module_path(module: str, cwd: Optional[Path] = None) -> Path:
    """Where ``-m MODULE`` lives on this machine, found as ``python -m`` finds it from the
    current directory: its top-level package (copied to every host), or a module file."""
    if not _MODULE_RE.fullmatch(module):
        raise UsageError(f"-m {module!r}: not a Python module name (dotted names of letters, "
                         "digits and '_', e.g. -m mypkg.train).")
    base = Path(os.path.abspath(cwd or os.getcwd()))
    top = module.split(".", maxsplit=1)[0]
    if (base / top).is_dir():
        return base / top
    if (base / f"{top}.py").is_file() and "." not in module:
        return base / f"{top}.py"
    raise UsageError(f"-m {module}: there is no package {top}/ or module {top}.py in {base}. "
                     "Run clusterrun from the directory that holds it, as `python -m` needs; "
                     "that package is what gets copied to every host.")
