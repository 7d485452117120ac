"""Test payload: each rank starts a daemon that leaves its process tree every way a process can
(double fork, setsid, an emptied environment, a new process name), writes the daemon's pid to
$TEST_DIR/escaped-<rank>.pid, then sleeps, or fails with ESCAPE_FAIL_CODE when rank
ESCAPE_FAIL_RANK after ESCAPE_FAIL_AFTER seconds."""

import os
import subprocess
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
pidfile = Path(os.environ["TEST_DIR"]) / f"escaped-{rank}.pid"
pidfile.parent.mkdir(parents=True, exist_ok=True)
# setsid + `bash -c '... &'` is a double fork; env -i drops CLUSTERRUN_RUN_ID and every other
# trace of the run; exec -a renames it so that no pattern finds it either.
subprocess.run(["setsid", "env", "-i", "/bin/bash", "-c",
                "(exec -a innocent-daemon sleep 600) </dev/null >/dev/null 2>&1 & "
                f"echo $! > {pidfile}"], check=True)
while not pidfile.exists() or not pidfile.read_text().strip():
    time.sleep(0.05)
print(f"rank {rank} escaped daemon {pidfile.read_text().strip()}", flush=True)
if str(rank) == os.environ.get("ESCAPE_FAIL_RANK"):
    time.sleep(float(os.environ.get("ESCAPE_FAIL_AFTER", "2")))
    sys.exit(int(os.environ.get("ESCAPE_FAIL_CODE", "3")))
time.sleep(float(os.environ.get("SLEEP", "600")))
