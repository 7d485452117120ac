"""What reading a rank's Flight Recorder dump costs a host's supervisor: the CPU of
`clusterrun.remote.shared.flight.flight` (read, unpickle, summarise) on one full buffer of 2000
records (FLIGHT_RECORDS), without stack frames and with 20 frames a record. The buffers are
built from the records a 3-rank gloo group's recorder wrote (tests/fakes/flight-recorder),
renumbered; what torch itself spends writing the dump is not measured here. No root, no cluster.

    .venv/bin/python benchmarks/flight.py --repeat 20

Writes benchmarks/flight.json (--out) with the commit, machine and command (common.provenance),
every sample and the medians.
"""

from __future__ import annotations

import argparse
import copy
import json
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, finish, provenance  # puts the repository on sys.path

from clusterrun.plan.environment import FLIGHT_RECORDS
from clusterrun.remote.shared import flight

RECORDED = REPO / "tests" / "fakes" / "flight-recorder" / "flight-rank-0"


def full_buffer(frames: int) -> dict[str, Any]:
    """The recorded dump with FLIGHT_RECORDS entries, each with ``frames`` stack frames."""
    dump: dict[str, Any] = pickle.loads(RECORDED.read_bytes())
    seen = dump["entries"]
    entries = []
    for i in range(FLIGHT_RECORDS):
        entry = copy.deepcopy(seen[i % len(seen)])
        entry.update(record_id=i, collective_seq_id=i + 1)
        if frames:
            entry["frames"] = [{"name": f"_call_impl_{k}", "filename": "/opt/conda/lib/python3.11/"
                                f"site-packages/torch/nn/modules/module_{k}.py",
                                "line": 100 + k} for k in range(frames)]
        entries.append(entry)
    dump["entries"] = entries
    return dump


def cpu_of_reading(folder: Path) -> float:
    start = time.process_time()
    found = flight.flight(str(folder))
    spent = time.process_time() - start
    assert found and found[0]["entries"] == FLIGHT_RECORDS, found
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "flight.json")
    args = parser.parse_args()
    prov = provenance()
    cases = {}
    for frames in (0, 20):
        with tempfile.TemporaryDirectory() as folder:
            data = pickle.dumps(full_buffer(frames))
            (Path(folder) / f"{flight.DUMP}0").write_bytes(data)
            samples = [cpu_of_reading(Path(folder)) for _ in range(args.repeat)]
        cases[f"{frames} frames"] = {
            "dump_bytes": len(data), "records": FLIGHT_RECORDS,
            "median_cpu_ms": round(statistics.median(samples) * 1000, 2),
            "samples_ms": [round(s * 1000, 2) for s in samples]}
        print(f"{frames:2} frames a record: {len(data) / 1e6:.1f} MB dump, "
              f"{cases[f'{frames} frames']['median_cpu_ms']} ms of CPU to read (median of "
              f"{args.repeat})", file=sys.stderr)
    results = {**finish(prov), "cases": cases}
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
