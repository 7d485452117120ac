"""`clusterrun check --smoke`: one all-reduce across every host on the chosen interfaces.

Each rank adds rank+1; everyone must see world*(world+1)/2. A wrong interface or a blocked port
shows up here as a clear failure within a minute instead of a hang at the first collective.

With `--bandwidth-bytes N` (`check --smoke --bandwidth`) it then times an all-reduce of N bytes
and rank 0 prints its bus bandwidth, as nccl-tests reports it (busbw): size / time x 2(n-1)/n.
A ring all-reduce moves 2(n-1)/n of the buffer through every rank's link, so busbw is comparable
with the link's own speed whatever the number of ranks.
"""

import argparse
import datetime
import os
import socket
import sys
import time

WARN_GBIT = 10.0  # as `check --bandwidth` (clusterrun/preflight/bandwidth.py)
TIMED = 3  # iterations averaged, after one untimed warm-up


def bus_bandwidth(nbytes, seconds, world):
    """Bytes per second through each rank's link during an all-reduce of ``nbytes`` that took
    ``seconds`` across ``world`` ranks (0 for one rank: nothing crosses a link)."""
    if seconds <= 0 or world < 1:
        return 0.0
    return nbytes / seconds * 2 * (world - 1) / world


def bandwidth_line(nbytes, seconds, world):
    algbw = nbytes / seconds if seconds > 0 else 0.0
    busbw = bus_bandwidth(nbytes, seconds, world)
    line = (f"all-reduce of {nbytes / 1e6:.0f} MB across {world} ranks: "
            f"{seconds * 1e3:.1f} ms, algbw {algbw / 1e9:.2f} GB/s, "
            f"bus bandwidth {busbw / 1e9:.2f} GB/s ({busbw * 8 / 1e9:.2f} Gbit/s)")
    if world > 1 and busbw * 8 / 1e9 < WARN_GBIT:
        line += (f"; warning: below {WARN_GBIT:g} Gbit/s, multi-node training on this network "
                 "may be slower than on one node")
    return line


def timed_allreduce(dist, torch, device, nbytes, use_cuda):
    """The slowest rank's mean time for one all-reduce of ``nbytes``."""
    tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    dist.all_reduce(tensor)  # warm-up: connections and buffers set up, not timed
    if use_cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(TIMED):
        dist.all_reduce(tensor)
    if use_cuda:
        torch.cuda.synchronize()
    took = torch.tensor([(time.perf_counter() - start) / TIMED], device=device)
    # The collective is done when its slowest rank is: report that rank's time.
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return tensor.numel() * 4, took.item()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--bandwidth-bytes", type=int, default=0)
    args, _ = parser.parse_known_args(argv)
    # Imported here so that bus_bandwidth() can be used where torch is not installed.
    import torch
    import torch.distributed as dist

    use_cuda = torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES") != ""
    backend = "nccl" if use_cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    payload = torch.ones(1 << 20, device=device)  # 4 MB
    dist.all_reduce(payload)
    start = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(payload)
    if use_cuda:
        torch.cuda.synchronize()
    took = (time.perf_counter() - start) / 5
    ok = value.item() == expected
    print(f"rank {rank}/{world} on {socket.gethostname()} via "
          f"{os.environ.get('GLOO_SOCKET_IFNAME')} ({backend}): sum {value.item():g} "
          f"{'ok' if ok else f'WRONG, expected {expected:g}'}; 4 MB all-reduce {took * 1e3:.1f} ms",
          flush=True)
    del payload
    if args.bandwidth_bytes > 0:
        nbytes, seconds = timed_allreduce(dist, torch, device, args.bandwidth_bytes, use_cuda)
        if rank == 0:
            print(bandwidth_line(nbytes, seconds, world), flush=True)
    dist.barrier()  # nobody tears down while a peer still talks to it
    dist.destroy_process_group()
    if backend == "gloo":
        # torch 2.13: Gloo's worker threads outlive destroy_process_group() and may still be
        # releasing the last collective's tensor, which takes the GIL; exiting at that moment
        # aborts the process now and then. Giving up the GIL briefly lets them finish.
        time.sleep(0.05)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
