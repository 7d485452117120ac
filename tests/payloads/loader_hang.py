"""Test payload: a Gloo job reading its batches through a DataLoader with worker processes.
On HANG_RANK, the dataset's ``__getitem__`` sleeps for ever from item HANG_ITEM on, in a worker
process: the rank waits for that batch in its DataLoader, the others in all_reduce.

    HANG_RANK     the rank whose DataLoader worker hangs (default 1; -1: none)
    HANG_ITEM     the first item that hangs (default 32: batch 8 of 4 items)
    STEPS         steps before exiting 0 (default 20)
"""

import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

dist.init_process_group("gloo")
rank = dist.get_rank()
hang = os.environ.get("HANG_RANK", "1") == str(rank)
hang_item = int(os.environ.get("HANG_ITEM", "32"))


class Shards(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, index):
        if hang and index >= hang_item:
            time.sleep(3600)
        return torch.full((4,), float(index))


loader = DataLoader(Shards(), batch_size=4, num_workers=2)
for step, batch in enumerate(loader):
    dist.all_reduce(batch)
    print(f"rank {rank} step {step}", flush=True)
    if step + 1 >= int(os.environ.get("STEPS", "20")):
        break
dist.destroy_process_group()
