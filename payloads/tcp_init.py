"""A script that rendezvous itself: ``init_process_group(init_method='tcp://...')`` with its rank
and the world size on the command line, as in the classic recipe typed on every machine with
only ``-rn`` changed:

    python tcp_init.py -bk gloo -im tcp://10.10.10.1:12345 -rn 0 -ws 2   # machine 1
    python tcp_init.py -bk gloo -im tcp://10.10.10.1:12345 -rn 1 -ws 2   # machine 2

With clusterrun it is one command; clusterrun starts the script itself (no torchrun) and fills
in each host's values:

    clusterrun launch --no-torchrun inventories/localhost.yaml payloads/tcp_init.py \\
        -bk gloo -im 'tcp://{master_addr}:{master_port}' -rn '{node_rank}' -ws '{nnodes}'

(one process per host; with ``nproc_per_node`` > 1 use ``-rn '{rank}' -ws '{world_size}'``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-bk", "--backend", default="gloo")
    parser.add_argument("-im", "--init-method", required=True)
    parser.add_argument("-rn", "--rank", type=int, required=True)
    parser.add_argument("-ws", "--world-size", type=int, required=True)
    parser.add_argument("--config", default="{}", help="JSON, passed through untouched")
    parser.add_argument("--exit-code", type=int, default=0, help="this rank exits with it")
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()
    config = json.loads(args.config)
    dist.init_process_group(args.backend, init_method=args.init_method, rank=args.rank,
                            world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=120))
    print(f"rank {args.rank}/{args.world_size} on {socket.gethostname()} "
          f"config={json.dumps(config, sort_keys=True)}", flush=True)
    if args.rank == args.fail_rank:
        print(f"rank {args.rank} exits with {args.exit_code} on purpose", flush=True)
        sys.exit(args.exit_code)
    value = torch.tensor([float(args.rank + 1)])
    dist.all_reduce(value)
    expected = args.world_size * (args.world_size + 1) / 2
    print(f"rank {args.rank}: sum {value.item():g} (expected {expected:g})", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.05)  # torch 2.13: let Gloo's threads finish (see payloads/README.md)
    return 0 if value.item() == expected else 1


if __name__ == "__main__":
    raise SystemExit(main())
