"""Test payload for `environment:`: a few DDP steps (gloo), then every rank records which
interpreter ran it and where torch, numpy and the test's own tiny package came from, in
TEST_DIR/rank-<RANK>.json on its host."""

import json
import os
import sys
import time

import numpy
import tinypkg
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(3):
    opt.zero_grad()
    loss = model(torch.randn(8, 4) + rank).pow(2).mean()
    loss.backward()
    opt.step()
weights = [float(w) for w in model.module.weight.detach().flatten()]
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, weights)
out = os.environ["TEST_DIR"]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"rank-{rank}.json"), "w") as handle:
    json.dump({"executable": sys.executable, "prefix": sys.prefix, "torch": torch.__file__,
               "torch_version": torch.__version__, "numpy": numpy.__version__,
               "tinypkg": tinypkg.WORD, "same_weights": all(g == weights for g in gathered)},
              handle)
print(f"rank {rank} trained with {sys.executable}", flush=True)
# Nobody tears its group down while a peer still talks to it; then, as payloads/allreduce_check.py
# says, torch 2.13's Gloo worker threads outlive destroy_process_group() and exiting while they
# release the last tensor aborts the process ("terminate called without an active exception"):
# giving up the GIL briefly lets them finish.
dist.barrier()
dist.destroy_process_group()
time.sleep(0.05)
