"""Smallest useful check that every rank can talk to every other rank.

Each rank contributes ``rank + 1``; after ``all_reduce(SUM)`` every rank must hold
``world_size * (world_size + 1) / 2``. A wrong sum means a rank was counted twice or
missing; a hang means some rank cannot reach another one (usually the wrong network
interface: set ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``). Each rank prints::

    [allreduce] rank 0/2 ok sum=3 host=node-a iface=eth0 nccl_iface=unset backend=gloo

and exits 0, or prints a MISMATCH line to stderr and exits 1. With ``--iters N`` rank 0
also times N all-reduces of ``--size`` float32 elements and prints a rough bandwidth.

    torchrun --nproc-per-node 2 payloads/allreduce_check.py
    torchrun --nproc-per-node 2 payloads/allreduce_check.py --size 4000000 --iters 20
    clusterrun launch inventories/localhost.yaml payloads/allreduce_check.py
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist


def say(msg: str, *, err: bool = False) -> None:
    """One write per line, so lines of ranks sharing a pipe or terminal never interleave."""
    stream = sys.stderr if err else sys.stdout
    stream.write(msg + "\n")
    stream.flush()


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="all_reduce sanity check (and rough bandwidth)")
    p.add_argument("--size", type=int, default=1, help="float32 elements per tensor")
    p.add_argument("--iters", type=int, default=0, help="timed all-reduces (0: no timing)")
    p.add_argument("--warmup", type=int, default=2, help="untimed all-reduces before timing")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    p.add_argument("--timeout-s", type=float, default=120.0, help="collective timeout")
    args = p.parse_args(argv)
    if args.size < 1 or args.iters < 0 or args.warmup < 0:
        p.error("--size must be >= 1, --iters and --warmup >= 0")
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bandwidth(
    x: torch.Tensor, iters: int, warmup: int, world_size: int, device: torch.device
) -> tuple[float, float, float]:
    """Return (seconds per all-reduce, algorithm GB/s, bus GB/s) as nccl-tests defines them."""
    for _ in range(warmup):
        dist.all_reduce(x)
    sync(device)
    dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync(device)
    dt = (time.perf_counter() - t0) / iters
    nbytes = x.numel() * x.element_size()
    algbw = nbytes / dt / 1e9
    busbw = algbw * 2 * (world_size - 1) / world_size  # bytes each link really carries
    return dt, algbw, busbw


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    # torchrun sets these; a bare `python allreduce_check.py` is a world of one.
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if "RANK" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])

    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > local_rank
    backend = args.backend if args.backend != "auto" else ("nccl" if has_gpu else "gloo")
    if backend == "nccl":
        if not has_gpu:
            say(f"[allreduce] rank {rank}: --backend nccl but no GPU {local_rank}", err=True)
            return 1
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    dist.init_process_group(
        backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=args.timeout_s)
    )
    host = socket.gethostname()
    iface = os.environ.get("GLOO_SOCKET_IFNAME") or "unset"
    nccl_iface = os.environ.get("NCCL_SOCKET_IFNAME") or "unset"

    x = torch.full((args.size,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    expected = world_size * (world_size + 1) // 2
    lo, hi = float(x.min()), float(x.max())  # every element must hold the same sum
    ok = lo == hi == expected
    where = f"host={host} iface={iface} nccl_iface={nccl_iface} backend={backend}"
    if ok:
        say(f"[allreduce] rank {rank}/{world_size} ok sum={int(lo)} {where}")
    else:
        got = f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"
        say(
            f"[allreduce] rank {rank}/{world_size} MISMATCH sum={got} expected={expected} "
            f"{where}: some rank was missing, counted twice, or has a wrong RANK/WORLD_SIZE",
            err=True,
        )

    if ok and args.iters > 0:
        dt, algbw, busbw = bandwidth(x, args.iters, args.warmup, world_size, device)
        if rank == 0:
            mib = x.numel() * x.element_size() / 2**20
            say(
                f"[allreduce] {mib:.2f} MiB x {args.iters} iters over {world_size} ranks "
                f"({backend}): {dt * 1e3:.3f} ms each, algbw {algbw:.3f} GB/s, "
                f"busbw {busbw:.3f} GB/s"
            )

    # Final barrier, then teardown: nobody leaves while a peer still talks to it.
    dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
    dist.destroy_process_group()
    if backend == "gloo":
        # torch 2.13: Gloo's worker threads outlive destroy_process_group() and may still be
        # releasing the last all_reduce's tensor, which takes the GIL; exiting at that moment
        # aborts the process ("terminate called without an active exception"). Giving up the
        # GIL briefly lets them finish.
        time.sleep(0.05)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
