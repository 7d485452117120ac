"""torchrun's own options: the ones clusterrun sets on every host, and the ones a user may pass
through with ``--torchrun-arg``."""

from __future__ import annotations

from collections.abc import Sequence

from clusterrun.errors import UsageError

# Set by clusterrun per host (static rendezvous, node ranks, output capture): passing them would
# make hosts disagree or break the run's supervision. Spelled as torchrun accepts them, with
# dashes or underscores.
OWNED = {
    "--nnodes": "one per inventory host",
    "--node-rank": "the master is 0, the others follow in inventory order",
    "--nproc-per-node": "use `nproc_per_node:` in the inventory or --nproc-per-node",
    "--master-addr": "use `master_addr:` in the inventory",
    "--master-port": "use `master_port:` in the inventory or --master-port",
    "--rdzv-backend": "clusterrun uses torchrun's static rendezvous",
    "--rdzv-endpoint": "clusterrun uses torchrun's static rendezvous",
    "--rdzv-id": "clusterrun uses torchrun's static rendezvous",
    "--rdzv-conf": "clusterrun uses torchrun's static rendezvous",
    "--standalone": "clusterrun runs one node per inventory host",
    "--max-restarts": "a rank failure ends the run on every host; restarts are clusterrun's own "
                      "(launch --max-restarts) on a healthy set of hosts",
    "--log-dir": "each node's torchrun logs are kept in its run directory",
    "--redirects": "each rank's output already goes to a file on its host",
    "--tee": "each rank's output already goes to a file on its host",
    "--no-python": "clusterrun runs each rank under its own output wrapper",
    "--module": "use clusterrun launch -m MODULE",
    "--run-path": "give the script's path as SCRIPT",
    "--role": "every host runs the same role",
}
_ALIASES = {"-r": "--redirects", "-t": "--tee", "-m": "--module"}


def _canonical(option: str) -> str:
    name = option.split("=", 1)[0]
    name = _ALIASES.get(name, name)
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def passthrough(args: Sequence[str]) -> tuple[str, ...]:
    """Validate ``--torchrun-arg`` values: each one torchrun option, `--name` or `--name=value`
    (as one word, so it cannot be mistaken for the script's), never one clusterrun owns."""
    for arg in args:
        if not arg.startswith("-"):
            raise UsageError(f"--torchrun-arg {arg!r}: give one torchrun option per "
                             "--torchrun-arg, with its value after '=' "
                             "(e.g. --torchrun-arg=--monitor-interval=1).")
        name = _canonical(arg)
        if name in OWNED:
            raise UsageError(f"--torchrun-arg {arg!r}: clusterrun sets {name} itself on every "
                             f"host ({OWNED[name]}).")
    return tuple(args)
