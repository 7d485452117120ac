"""Test payload for `clusterrun pull`: a few DDP steps (gloo), then every rank saves its own
checkpoint under its working directory, ``checkpoints/rank-<RANK>.pt`` (the model, the step,
and random bytes so that no two runs write the same file), and rank 0 a ``metrics.json``.

    HOLD   seconds every rank waits after writing, still running (default 0): a detached run
           to pull while it runs
"""

import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(3):
    opt.zero_grad()
    loss = model(torch.randn(16, 8) + rank).pow(2).mean()
    loss.backward()
    opt.step()
os.makedirs("checkpoints", exist_ok=True)
torch.save({"model": model.module.state_dict(), "step": 3, "noise": os.urandom(4096 + rank)},
           f"checkpoints/rank-{rank}.pt")
if rank == 0:
    with open("metrics.json", "w") as handle:
        json.dump({"loss": float(loss.detach()), "world_size": dist.get_world_size()}, handle)
print(f"rank {rank} saved its checkpoint", flush=True)
dist.barrier()
time.sleep(float(os.environ.get("HOLD", "0")))
dist.destroy_process_group()
