"""Test payload: every rank records what it saw (argv, environment, host) in a file on its own
host, prints one line, and can fail or sleep on request (a fault schedule from the environment).

    TEST_DIR      where to write rank-<RANK>.json on the host (default /tmp/clusterrun-test)
    FAIL_RANK     the global rank that exits with FAIL_CODE after FAIL_AFTER seconds
    SLEEP         seconds every other rank sleeps before exiting 0
    IGNORE_TERM   if set, ranks ignore SIGTERM (only SIGKILL ends them)
"""

import json
import os
import signal
import socket
import sys
import time

rank = int(os.environ["RANK"])
out_dir = os.environ.get("TEST_DIR", "/tmp/clusterrun-test")
os.makedirs(out_dir, exist_ok=True)
record = {
    "argv": sys.argv[1:],
    "env": dict(os.environ),
    "hostname": socket.gethostname(),
    "pid": os.getpid(),
    "cwd": os.getcwd(),
    "interfaces": sorted(os.listdir("/sys/class/net")),
    # What podman and docker put in every container they run.
    "in_container": os.path.exists("/run/.containerenv") or os.path.exists("/.dockerenv"),
}
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as handle:
    json.dump(record, handle)


def on_term(signum, _frame):
    print(f"rank {rank} got signal {signum}", flush=True)
    with open(os.path.join(out_dir, f"rank-{rank}.term"), "w") as handle:
        handle.write(str(time.time()))
    sys.exit(0)


signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("IGNORE_TERM") else on_term)
print(f"report rank {rank} on {socket.gethostname()}", flush=True)
if os.environ.get("FAIL_RANK") == str(rank):
    time.sleep(float(os.environ.get("FAIL_AFTER", "1")))
    print(f"rank {rank} failing with {os.environ.get('FAIL_CODE', '3')}", flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "3")))
time.sleep(float(os.environ.get("SLEEP", "0")))
print(f"rank {rank} done", flush=True)
