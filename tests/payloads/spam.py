"""Test payload: every rank prints LINES numbered lines (`r<RANK> <i> <time>`), PERIOD seconds
apart (0: as fast as it can), so a test can check that every line arrives exactly once, in
order, and how fast the rank itself made progress."""

import os
import time

rank = int(os.environ["RANK"])
lines = int(os.environ.get("LINES", "1000"))
period = float(os.environ.get("PERIOD", "0"))
pad = "x" * int(os.environ.get("PAD", "40"))
start = time.time()
for i in range(lines):
    print(f"r{rank} {i:07d} {time.time():.3f} {pad}")
    if period:
        time.sleep(period)
print(f"r{rank} finished {lines} lines in {time.time() - start:.2f} s", flush=True)
