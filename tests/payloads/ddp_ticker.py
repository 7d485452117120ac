"""Test payload: DistributedDataParallel on Gloo with no explicit collective: the gradients'
all-reduce runs in DDP's reducer, inside ``loss.backward()``. For `stacks --profile` and the stall
watchdog on the job users actually write.

    SLOW_RANK      this global rank computes SLOW_SECONDS more per step, in its forward
    SLOW_SECONDS   (default 0.4)
    HANG_RANK      this global rank sleeps for ever in its forward at step HANG_STEP
    HANG_STEP      (default 5)
    STEPS          steps before exiting 0 (default: until stopped)
"""

import os
import time

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
torch.manual_seed(0)
slow = float(os.environ.get("SLOW_SECONDS", "0.4")) if os.environ.get("SLOW_RANK") == str(
    rank) else 0.0
hang = os.environ.get("HANG_RANK") == str(rank)
hang_step = int(os.environ.get("HANG_STEP", "5"))
steps = int(os.environ.get("STEPS", "0")) or None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))
        self.extra = torch.rand(64, 64)

    def forward(self, x, step):
        if slow:
            end = time.monotonic() + slow
            y = self.extra
            while time.monotonic() < end:
                y = torch.tanh(y @ self.extra)
        if hang and step == hang_step:
            time.sleep(3600)
        return self.layers(x)


model = nn.parallel.DistributedDataParallel(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.rand(32, 256)
target = torch.randint(0, 10, (32,))
step = 0
while steps is None or step < steps:
    step += 1
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(data, step), target)
    loss.backward()
    optimizer.step()
    print(f"step {step} rank {rank} loss {loss.item():.4f} at {time.time():.3f}", flush=True)
dist.destroy_process_group()
