"""torchrun's launcher options, each with what `clusterrun launch` makes of it: the one table
that launch's usage errors, ``--torchrun-arg``'s checks, `launch --help` and
docs/bring-your-script.md all say."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from clusterrun.errors import UsageError

# What launch makes of one torchrun option:
SAME = "same"  # launch takes it itself, with torchrun's meaning
NOTED = "noted"  # launch takes it, with a meaning of clusterrun's that the note says
PASSED = "passed"  # torchrun gets it through --torchrun-arg, as given
REFUSED = "refused"  # clusterrun does this itself; the note says how

HOW = {SAME: "launch takes it", NOTED: "launch takes it, see note",
       PASSED: "through --torchrun-arg", REFUSED: "refused"}


@dataclass(frozen=True)
class Word:
    """torchrun options launch answers alike: their dashed names (torchrun also takes each with
    underscores) and one-letter aliases, and launch's answer."""

    names: tuple[str, ...]
    how: str
    says: str

    @property
    def spelled(self) -> str:
        return ", ".join(self.names)


_OUTPUT = ("every rank's stdout and stderr already go to rank-R.log on its host, streamed "
           "here and mirrored to $CLUSTERRUN_HOME/runs/<id>/; `clusterrun logs --rank R` "
           "shows one rank's")

WORDS = (
    Word(("--nnodes",), NOTED, "the node count is the inventory's hosts (spares aside, after "
         "-w/-x): N is accepted when it is that count, with a note, and refused otherwise; "
         "torchrun's elastic MIN:MAX is --min-nodes MIN with --max-restarts"),
    Word(("--nproc-per-node",), SAME, "N, `gpu` (the host's GPUs; refused on a host without "
         "any), `cpu` (its CPUs) or `auto` (its GPUs, else 1, where torchrun's falls back to "
         "the CPU count), resolved per host; default: the inventory's `nproc_per_node:`"),
    Word(("--master-port",), SAME, "the c10d store's port on the master (default: a free one, "
         "checked there); also `master_port:` in the inventory"),
    Word(("-m", "--module"), SAME, "runs a module as `python -m` does, instead of SCRIPT; its "
         "package is copied to every host"),
    Word(("--max-restarts",), NOTED, "clusterrun's --max-restarts N starts the whole run again "
         "(every host, every rank) after a failure, on healthy hosts, spares taking failed "
         "hosts' places (docs/restarts.md); torchrun's in-place worker restarts are refused, "
         "also through --torchrun-arg: a failed rank ends the run on every host, so that no "
         "host's ranks wait in a collective for peers restarted elsewhere"),
    Word(("--monitor-interval", "--start-method", "--event-log-handler", "--role",
          "--logs-specs", "--numa-binding", "--signals-to-handle", "--virtual-local-rank"),
         PASSED, "passed to torchrun on every host as given, e.g. "
         "--torchrun-arg=--monitor-interval=1"),
    Word(("--shutdown-timeout",), PASSED, "passed to torchrun on every host as given; when "
         "clusterrun stops a run, launch --grace is the time from SIGTERM to SIGKILL"),
    Word(("--node-rank",), REFUSED, "each host's node rank is clusterrun's: the master "
         "(`master: true`, else the first host) is 0, the others follow in inventory order"),
    Word(("--master-addr",), REFUSED, "set `master_addr:` in the inventory (default: the "
         "master host's own address on its data interface); `master: true` marks the master"),
    Word(("--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf"), REFUSED,
         "clusterrun uses torchrun's static rendezvous at the master's address and a port it "
         "checks is free (--master-port picks it)"),
    Word(("--standalone",), REFUSED, "clusterrun runs one torchrun node per inventory host; "
         "for this machine alone give an inventory whose one host is `host: localhost`"),
    Word(("--local-addr",), REFUSED, "an address of each host's own, which clusterrun finds "
         "on its data interface (`interface:` in the inventory picks it): one value for every "
         "host would be wrong"),
    Word(("--no-python", "--run-path"), REFUSED, "every rank starts as `PYTHON -u SCRIPT` "
         "under clusterrun's output wrapper (clusterrun gives torchrun --no-python for that "
         "wrapper itself); start a program that is not Python from a Python SCRIPT"),
    Word(("--log-dir",), REFUSED, "set on each host to the run's folder there "
         "(<rundir>/torchelastic); every rank's output is in rank-R.log beside it, which "
         "`clusterrun logs` shows"),
    Word(("-r", "--redirects", "-t", "--tee"), REFUSED, _OUTPUT),
    Word(("--local-ranks-filter",), REFUSED, "every rank's lines are shown; `clusterrun logs "
         "--rank RANKS --node NODESET` picks some"),
    Word(("--duplicate-stdout-filters", "--duplicate-stderr-filters"), REFUSED,
         "`clusterrun logs --grep REGEX` picks lines from every rank's log"),
)
# torchrun's options that take no value (store_true): --torchrun-arg=--standalone, not =VALUE.
FLAGS = frozenset({"--standalone", "--module", "--no-python", "--run-path",
                   "--virtual-local-rank"})
_BY_NAME = {name: w for w in WORDS for name in w.names}
_SHORT = {"-m": "--module", "-r": "--redirects", "-t": "--tee"}


def canonical(option: str) -> str:
    """``--nproc_per_node=4`` -> ``--nproc-per-node``; ``-r`` -> ``--redirects``."""
    name = option.split("=", 1)[0]
    if name in _SHORT:
        return _SHORT[name]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def word(option: str) -> Optional[Word]:
    """torchrun's option ``option`` (any spelling, ``=value`` allowed), None if it is not one."""
    return _BY_NAME.get(canonical(option))


def on_launch(option: str) -> Optional[str]:
    """Why `clusterrun launch` does not take torchrun's ``option`` as given, and what to use:
    None where it is not torchrun's."""
    found, name = word(option), canonical(option)
    if found is None:
        return None
    if found.how == PASSED:
        value = ("=" + option.split("=", 1)[1] if "=" in option
                 else "" if name in FLAGS else "=VALUE")
        return f"torchrun's {name} goes through --torchrun-arg: --torchrun-arg={name}{value}"
    if found.how == SAME:
        return f"clusterrun spells it {name}: {found.says}"
    return f"torchrun's {name}: {found.says}"


def passthrough(args: Sequence[str]) -> tuple[str, ...]:
    """Validate ``--torchrun-arg`` values: each one torchrun option, `--name` or `--name=value`
    (as one word, so it cannot be mistaken for the script's), one the table passes."""
    for arg in args:
        if not arg.startswith("-"):
            raise UsageError(f"--torchrun-arg {arg!r}: give one torchrun option per "
                             "--torchrun-arg, with its value after '=' "
                             "(e.g. --torchrun-arg=--monitor-interval=1).")
        found = word(arg)
        if found is None or found.how == PASSED:
            continue  # an option of a newer torchrun than this table's: its own to judge
        name = canonical(arg)
        if found.how == SAME:
            raise UsageError(f"--torchrun-arg {arg!r}: clusterrun sets {name} itself on every "
                             f"host; give launch {name} instead: {found.says}.")
        raise UsageError(f"--torchrun-arg {arg!r}: clusterrun sets {name} itself on every "
                         f"host: {found.says}.")
    return tuple(args)


def help_text(width: int = 76) -> str:
    """The table as `launch --help`'s epilog shows it, one option per paragraph."""
    lines = ["torchrun's options on clusterrun launch (docs/bring-your-script.md):", "", "\b"]
    for w in WORDS:
        head = f"{w.spelled} ({HOW[w.how]}): "
        lines.extend(textwrap.wrap(head + w.says, width, initial_indent="  ",
                                   subsequent_indent="      ", break_on_hyphens=False,
                                   break_long_words=False))
    return "\n".join(lines)


def markdown() -> str:
    """The table as docs/bring-your-script.md holds it."""
    rows = ["| torchrun | on `clusterrun launch` | what clusterrun does |",
            "|---|---|---|"]
    for w in WORDS:
        names = ", ".join(f"`{name}`" for name in w.names)
        rows.append(f"| {names} | {HOW[w.how]} | {w.says} |")
    return "\n".join(rows)
