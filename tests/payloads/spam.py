"""Test payload: every rank prints LINES numbered lines (`r<RANK> <i> <time>`), PERIOD seconds
apart (0: as fast as it can), so a test can check that every line arrives exactly once, in
order, and how fast the rank itself made progress. With HOLD_AT and HOLD_FILE a rank stops
before line HOLD_AT until the file HOLD_FILE exists on its host: a test can act while the run
is part-way, however slowly this machine runs it."""

import os
import sys
import time

rank = int(os.environ["RANK"])
lines = int(os.environ.get("LINES", "1000"))
period = float(os.environ.get("PERIOD", "0"))
pad = "x" * int(os.environ.get("PAD", "40"))
hold_at = int(os.environ.get("HOLD_AT", "-1"))
hold_file = os.environ.get("HOLD_FILE", "")
start = time.time()
for i in range(lines):
    if i == hold_at:
        sys.stdout.flush()
        while not os.path.exists(hold_file):
            time.sleep(0.05)
    print(f"r{rank} {i:07d} {time.time():.3f} {pad}")
    if period:
        time.sleep(period)
print(f"r{rank} finished {lines} lines in {time.time() - start:.2f} s", flush=True)
