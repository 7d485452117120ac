"""Test payload: a synchronous gloo job that keeps a steady pace, for `top` and `stacks
--profile`. Each step every rank computes a little, sleeps a little, then joins an all_reduce,
so the slowest rank sets everyone's pace, as in data-parallel training.

    STEP_SLEEP     seconds each rank sleeps per step outside any collective (default 0.1)
    WORK           matrix products each rank computes per step (default 20)
    SLOW_RANK      this global rank computes SLOW_FACTOR times as much per step
    SLOW_FACTOR    (default 10)
    PRINT_EVERY    print a line every N steps (default 1)
    STEPS          steps before exiting 0 (default: until stopped)
"""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
sleep = float(os.environ.get("STEP_SLEEP", "0.1"))
work = int(os.environ.get("WORK", "20"))
if os.environ.get("SLOW_RANK") == str(rank):
    work *= int(os.environ.get("SLOW_FACTOR", "10"))
every = int(os.environ.get("PRINT_EVERY", "1"))
steps = int(os.environ.get("STEPS", "0")) or None
a = torch.rand(64, 64)
grad = torch.zeros(256)


def compute():
    x = a
    for _ in range(work):
        x = torch.tanh(x @ a)
    return x


step = 0
while steps is None or step < steps:
    step += 1
    compute()
    time.sleep(sleep)
    dist.all_reduce(grad)
    if step % every == 0:
        print(f"step {step} rank {rank} at {time.time():.3f}", flush=True)
dist.destroy_process_group()
