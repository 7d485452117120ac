"""`clusterrun check --smoke`: one all-reduce across every host on the chosen interfaces.

Each rank adds rank+1; everyone must see world*(world+1)/2. A wrong interface or a blocked port
shows up here as a clear failure within a minute instead of a hang at the first collective.
"""

import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
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
