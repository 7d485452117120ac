"""Test payload: proves each rank got WANDB_API_KEY and DB_PASS without ever printing or
storing them (only a hash of each), and stays up for a few seconds so the hosts' command lines
can be inspected."""

import hashlib
import os
import time

for name in ("WANDB_API_KEY", "DB_PASS"):
    value = os.environ.get(name, "")
    digest = hashlib.sha256(value.encode()).hexdigest()[:16]
    print(f"rank {os.environ['RANK']} {name} sha256 {digest if value else 'MISSING'}",
          flush=True)
time.sleep(float(os.environ.get("SLEEP", "3")))
