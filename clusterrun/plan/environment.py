"""The ranks' environment: what is forwarded from this shell, read from an env file, and set in
the inventory or with --env, merged in one documented order.

Precedence, lowest first: forwarded from the controller's environment < env file < inventory
`defaults: env:` < the host's own `env:` < `--env` on the command line. clusterrun's own
variables (each host's NCCL/Gloo interface, CLUSTERRUN_*, torchrun's) are set last: a value
forwarded from this shell is one machine's, and interfaces differ between hosts. The inventory's
`interface:` is how to choose one.

NCCL's own log: unless the user chose NCCL_DEBUG (anywhere above), the ranks get
NCCL_DEBUG=INFO with NCCL_DEBUG_FILE in the run's folder on their host, one file per process,
never the console; each host's supervisor reads them to report what NCCL chose
(clusterrun/remote/node/nccllog.py). A gloo run never opens them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from clusterrun.errors import UsageError

# What training scripts expect from the shell they were started in. CUDA_VISIBLE_DEVICES is left
# out on purpose: each host's GPUs are chosen per host (`gpus:`), never copied from here.
FORWARDED = ("NCCL_*", "GLOO_*", "TORCH_*", "PYTORCH_*", "CUDA_*", "OMP_NUM_THREADS", "WANDB_*",
             "HF_*", "HUGGING_FACE_*", "MLFLOW_*", "PYTHONUNBUFFERED")
NEVER_FORWARDED = ("CUDA_VISIBLE_DEVICES",)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# NCCL expands %h (hostname) and %p (pid) in NCCL_DEBUG_FILE; remote/node/nccllog.py reads this
# glob.
NCCL_LOG_NAME = "nccl-%h.%p.log"


def nccl_debug(env: Mapping[str, str], rundir: str) -> dict[str, str]:
    """What to add to a host's environment so NCCL logs what it chose into the run's folder:
    nothing when the user set NCCL_DEBUG or NCCL_DEBUG_FILE themselves (theirs wins, as set)."""
    if "NCCL_DEBUG" in env or "NCCL_DEBUG_FILE" in env:
        return {}
    # NCCL reads '%' as the start of a placeholder: a literal one in the path is written %%.
    folder = rundir.replace("%", "%%")
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": f"{folder}/{NCCL_LOG_NAME}"}


# torch's Flight Recorder (docs/troubleshooting.md): NCCL process groups keep their last
# collectives in a ring buffer and write it to the run's folder when a collective times out, or
# when `clusterrun stacks` writes to a rank's pipe (remote/shared/flight.py).
FLIGHT_RECORDER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
                   "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE",
                   "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
FLIGHT_RECORDS = 2000  # entries per process group: about 2 MB per rank


def flight_recorder(env: Mapping[str, str], rundir: str, gpus: bool) -> dict[str, str]:
    """Armed on GPU hosts only, where NCCL dumps it on a timeout; Gloo records too but never
    dumps, so there it would cost each collective a record for nothing. The user's own
    settings win: nothing is added when any of them is set."""
    if not gpus or any(name in env for name in FLIGHT_RECORDER):
        return {}
    prefix = f"{rundir}/flight-rank-"  # torch appends the rank
    return {"TORCH_FR_BUFFER_SIZE": str(FLIGHT_RECORDS),
            "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_RECORDS),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": prefix,
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
            # torch makes <this><rank>.pipe; a write to it dumps the buffer while the job runs
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{rundir}/flight-pipe-rank-"}


def forwarded(environ: Mapping[str, str], extra: Sequence[str] = ()) -> dict[str, str]:
    """The variables of ``environ`` whose names match the allow-list (or ``extra`` globs)."""
    patterns = (*FORWARDED, *extra)
    return {name: value for name, value in sorted(environ.items())
            if name not in NEVER_FORWARDED and _NAME.fullmatch(name)
            and any(fnmatch.fnmatchcase(name, p) for p in patterns)}


def read_env_file(path: Path) -> dict[str, str]:
    """A dotenv file: ``NAME=value`` lines, optional ``export``, ``#`` comments, blank lines,
    values in single quotes (literal) or double quotes (``\\n``, ``\\"`` and ``\\\\`` escapes).
    No interpolation and no command substitution: values arrive as written."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read this env file ({exc}).") from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not _NAME.fullmatch(name):
            raise UsageError(f"{path}:{number}: expected NAME=value (a dotenv line), got "
                             f"{raw.strip()[:60]!r}.")
        out[name] = _value(path, number, value.strip())
    return out


def _value(path: Path, number: int, value: str) -> str:
    if value[:1] in ("'", '"'):
        quote = value[0]
        end = _closing(value, quote)
        if end < 0:
            raise UsageError(f"{path}:{number}: the value's {quote} quote is not closed.")
        rest = value[end + 1:].strip()
        if rest and not rest.startswith("#"):
            raise UsageError(f"{path}:{number}: unexpected text after the quoted value.")
        inner = value[1:end]
        if quote == "'":
            return inner
        return re.sub(r'\\([n"\\])', lambda m: "\n" if m.group(1) == "n" else m.group(1), inner)
    # Unquoted: a ` #` starts a comment, as in shells and python-dotenv.
    return re.split(r"\s+#", value, maxsplit=1)[0].rstrip()


def _closing(value: str, quote: str) -> int:
    i = 1
    while i < len(value):
        if value[i] == "\\" and quote == '"':
            i += 2
            continue
        if value[i] == quote:
            return i
        i += 1
    return -1


def merge(layers: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Later layers win: pass them lowest precedence first."""
    out: dict[str, str] = {}
    for layer in layers:
        out.update(layer)
    return out
