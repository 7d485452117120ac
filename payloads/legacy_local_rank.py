"""A script from the `python -m torch.distributed.launch` era: it parses ``--local_rank``.

torchrun passes no such argument (and newer launchers spell it ``--local-rank``, which this
argparse rejects), so this script fails under plain torchrun. Unchanged, it runs with:

    clusterrun launch --local-rank-arg inventories/localhost.yaml \
        payloads/legacy_local_rank.py --steps 3

Every process then gets ``--local_rank=<its LOCAL_RANK>`` as its first argument; the script's own
arguments follow untouched.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, required=True)  # the old launcher's habit
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(args.local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo")  # RANK/WORLD_SIZE from the env
    device = torch.device("cuda", args.local_rank) if use_cuda else torch.device("cpu")
    rank = dist.get_rank()
    print(f"rank {rank} --local_rank={args.local_rank} LOCAL_RANK={os.environ.get('LOCAL_RANK')} "
          f"host={socket.gethostname()} steps={args.steps}", flush=True)
    total = torch.zeros(1, device=device)
    for step in range(args.steps):
        value = torch.ones(1, device=device) * (step + 1)
        dist.all_reduce(value)
        total += value
    dist.barrier()
    if rank == 0:
        print(f"done: sum {total.item():g} over {dist.get_world_size()} ranks", flush=True)
    dist.destroy_process_group()
    if not use_cuda:
        time.sleep(0.05)  # torch 2.13: let Gloo's threads finish (see payloads/README.md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
