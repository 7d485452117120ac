"""Test payload: a rank that writes what NCCL 2.19 writes at init into the file NCCL_DEBUG_FILE
names (%h and %p expanded as NCCL does), for hosts without a GPU. The lines follow the captured
logs in tests/golden/nccl/ (2.19.3-roce.log, 2.19.3-socket-no-ib.log, ...).

    NCCL_SIM_SOCKET_HOST  the host (CLUSTERRUN_NODE) where NCCL finds no IB device: Socket
    NCCL_SIM_STUCK_RANK   a global rank that starts init and never completes it
    NCCL_SIM_NODES        the node count NCCL reports (default: the number of nodes)

Every rank prints its NCCL settings, then stays up a few seconds so the supervisor reads the
files while the run goes on.
"""

import fcntl
import os
import socket
import struct
import time

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
local = int(os.environ["LOCAL_RANK"])
nodes = int(os.environ.get("NCCL_SIM_NODES") or os.environ.get("GROUP_WORLD_SIZE") or 1)
target = os.environ.get("NCCL_DEBUG_FILE")
print(f"nccl env: NCCL_DEBUG={os.environ.get('NCCL_DEBUG')} NCCL_DEBUG_FILE={target}",
      flush=True)


def address(ifname):
    """The interface's IPv4 address (SIOCGIFADDR), as NCCL prints it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def lines():
    host = socket.gethostname().split(".")[0]
    pid = os.getpid()
    pre = f"{host}:{pid}:{pid} [{local}] NCCL INFO "
    ifname = os.environ["NCCL_SOCKET_IFNAME"].lstrip("=")
    addr = f"{ifname}:{address(ifname)}<0>"
    comm = (f"comm 0x55{pid:010x} rank {rank} nranks {world} cudaDev {local} nvmlDev {local} "
            f"busId {18 + local}000 commId 0x7ef9513a104d9d97")
    out = [pre + "Bootstrap : Using " + addr, pre + "cudaDriverVersion 12000"]
    if rank == 0:
        out.append("NCCL version 2.19.3+cuda12.3")
    if os.environ.get("NCCL_SIM_SOCKET_HOST") == os.environ["CLUSTERRUN_NODE"]:
        out += [pre + "NET/IB : No device found.", pre + "NET/Socket : Using [0]" + addr,
                pre + "Using network Socket"]
        via = "NET/Socket/0"
    else:
        out += [pre + "NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB " + addr,
                pre + "Using network IB"]
        via = "NET/IB/0/GDRDMA"
    out.append(pre + comm + " - Init START")
    out.append(pre + f"comm 0x55{pid:010x} rank {rank} nRanks {world} nNodes {nodes} "
               f"localRanks 2 localRank {local} MNNVL 0")
    peer = (rank + 2) % world
    out.append(pre + f"Channel 00/0 : {rank}[{local}] -> {peer}[{local}] [send] via {via}")
    if str(rank) != os.environ.get("NCCL_SIM_STUCK_RANK"):
        out.append(pre + comm + " - Init COMPLETE")
    return out


if target and os.environ.get("NCCL_DEBUG") == "INFO":
    name = target.replace("%h", socket.gethostname().split(".")[0]).replace(
        "%p", str(os.getpid()))
    with open(name, "w") as handle:
        for line in lines():
            handle.write(line + "\n")
            handle.flush()
            time.sleep(0.05)
time.sleep(float(os.environ.get("SLEEP", "4")))
