"""Test payload: ranks that stay up, and one that dies the way a training process dies: a
non-zero exit, a SIGKILL (the OOM killer) or a segmentation fault (a real invalid read).

    FAULT        exit:N | kill | segv (default: no fault)
    FAULT_RANK   the global rank that dies (default 0)
    FAULT_AFTER  seconds after its start (default 1)
    FAULT_MARK   a file (under /var/tmp, which the test sees) written just before the fault,
                 holding the wall-clock time and the pid
    TEST_DIR     where each rank writes rank-<RANK>.term when SIGTERM reaches it
    IGNORE_TERM  if set, ranks ignore SIGTERM (only SIGKILL ends them)
    SLEEP        seconds the ranks stay up (default 600)
"""

import ctypes
import os
import resource
import signal
import socket
import sys
import time

rank = int(os.environ["RANK"])
out_dir = os.environ.get("TEST_DIR", "/tmp/clusterrun-faulty")
os.makedirs(out_dir, exist_ok=True)
# A segfault must not leave a core file in the run's folder.
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def on_term(signum, _frame):
    with open(os.path.join(out_dir, f"rank-{rank}.term"), "w") as handle:
        handle.write(str(time.time()))
    print(f"rank {rank} got signal {signum}", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("IGNORE_TERM") else on_term)
print(f"faulty rank {rank} on {socket.gethostname()} pid {os.getpid()}", flush=True)
fault = os.environ.get("FAULT", "")
if fault and os.environ.get("FAULT_RANK", "0") == str(rank):
    time.sleep(float(os.environ.get("FAULT_AFTER", "1")))
    print(f"rank {rank} fault {fault}", flush=True)
    mark = os.environ.get("FAULT_MARK")
    if mark:
        with open(mark + ".tmp", "w") as handle:
            handle.write(f"{time.time()} {os.getpid()}\n")
        os.replace(mark + ".tmp", mark)
    if fault.startswith("exit:"):
        os._exit(int(fault[5:]))
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "segv":
        ctypes.string_at(0)  # reads address 0: SIGSEGV from the kernel, as a real crash
    raise SystemExit(f"unknown FAULT {fault!r}")
time.sleep(float(os.environ.get("SLEEP", "600")))
print(f"rank {rank} done", flush=True)
