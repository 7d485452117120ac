"""torch's Flight Recorder dumps in a run's folder on this host (stdlib only, Python 3.6+):
NCCL's watchdog writes one per rank when a collective timed out (plan/environment.py arms it);
`clusterrun stacks` reads the last collective each rank entered."""

import json
import os


def flight(rundir):
    """torch's Flight Recorder dumps in the run's folder (written by NCCL when a collective
    timed out; plan/environment.py arms it): per rank, the last collective it entered."""
    import pickle  # only here: most runs have no dump

    out = []
    try:
        names = sorted(n for n in os.listdir(rundir) if n.startswith("flight-rank-"))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(rundir, name), "rb") as handle:
                data = handle.read()
            # The run's own ranks wrote it (pickle, or JSON with TORCH_NCCL_USE_JSON).
            dump = json.loads(data) if data[:1] == b"{" else pickle.loads(data)  # noqa: S301
            entries = dump.get("entries") or []
        except Exception:  # a dump being written, or another torch's format: left out
            entries = []
        if entries:
            last = entries[-1]
            out.append({"rank": name[len("flight-rank-"):], "file": name,
                        "collective": str(last.get("profiling_name") or "?"),
                        "seq": last.get("collective_seq_id"), "state": last.get("state"),
                        "entries": len(entries)})
    return out
