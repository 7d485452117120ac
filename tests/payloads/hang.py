"""Test payload: a Gloo job that hangs on request, for `stacks` and the stall watchdog.

    HANG          "sleep": HANG_RANK sleeps outside any collective while the others wait in
                  all_reduce; "stop": HANG_RANK stops itself (SIGSTOP); "skip": HANG_RANK skips
                  an all_reduce and waits in a barrier the others never reach; "busy": every rank
                  computes silently for BUSY seconds (never a stall); "write": HANG_RANK writes
                  a checkpoint slowly for WRITE seconds (64 KiB every 0.25 s, then fsync: little
                  CPU, no output) while the others wait in all_reduce (never a stall); "" : no hang
    HANG_RANK     the rank that hangs (default 1)
    HANG_HOST     only there (its hostname): a spare that takes its place does not hang
    STEPS         all_reduce steps before the hang (default 3); each prints one line
    BUSY          seconds of silent computing for "busy" (default 40)
    WRITE         seconds of slow checkpoint writing for "write" (default 40)
"""

import os
import signal
import socket
import time

import torch
import torch.distributed as dist

mode = os.environ.get("HANG", "")
hang_rank = int(os.environ.get("HANG_RANK", "1"))
if os.environ.get("HANG_HOST", socket.gethostname()) != socket.gethostname():
    mode = ""
dist.init_process_group("gloo")
rank = dist.get_rank()
tensor = torch.ones(4)
for step in range(int(os.environ.get("STEPS", "3"))):
    dist.all_reduce(tensor)
    print(f"rank {rank} step {step}", flush=True)


def sleep_outside_collectives():
    time.sleep(3600)


def busy(seconds):
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        total += sum(i * i for i in range(10000))
    return total


def write_checkpoint_slowly(seconds):
    path = f"/tmp/hang-checkpoint-{os.getpid()}.pt"
    end = time.monotonic() + seconds
    with open(path, "wb", buffering=0) as out:
        while time.monotonic() < end:
            out.write(b"\0" * 65536)
            time.sleep(0.25)
        os.fsync(out.fileno())
    os.unlink(path)


if mode == "busy":
    busy(float(os.environ.get("BUSY", "40")))
elif rank == hang_rank and mode == "write":
    write_checkpoint_slowly(float(os.environ.get("WRITE", "40")))
elif rank == hang_rank and mode == "sleep":
    sleep_outside_collectives()
elif rank == hang_rank and mode == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
elif rank == hang_rank and mode == "skip":
    dist.barrier()
dist.all_reduce(tensor)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
