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
import errno
import fcntl
import json
import os
import selectors
import socket
import struct
import sys
import threading
import time

WARN_GBIT = 10.0  # as `check --bandwidth` (clusterrun/preflight/bandwidth.py)
TIMED = 3  # iterations averaged, after one untimed warm-up
# Ranks start as fast as their hosts import torch: waiting for each other may take a while on a
# loaded cluster. Once all are there, connecting and a tiny all-reduce take well under a second:
# a smoke test that fails does so within these seconds, not torch's default of 30 minutes.
JOIN_SECONDS = 180
CONNECT_SECONDS = 10
PAIR_SECONDS = 3  # a LAN connect takes milliseconds; 3 s still covers one lost SYN (resent at 1 s)
BANDWIDTH_SECONDS = 300


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


def timed_allreduce(dist, torch, device, nbytes, use_cuda, *, group=None):
    """The slowest rank's mean time for one all-reduce of ``nbytes``."""
    tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    dist.all_reduce(tensor, group=group)  # warm-up: connections and buffers set up, not timed
    if use_cuda:
        torch.cuda.synchronize()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(TIMED):
        dist.all_reduce(tensor, group=group)
    if use_cuda:
        torch.cuda.synchronize()
    took = torch.tensor([(time.perf_counter() - start) / TIMED], device=device)
    # The collective is done when its slowest rank is: report that rank's time.
    dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
    return tensor.numel() * 4, took.item()


def join(dist, rank, world, seconds):
    """The job's store (torchrun's, at MASTER_ADDR:MASTER_PORT), once every rank has reached
    it: waiting for slow starters is bounded by ``seconds``, apart from the connect timeout."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent,
                          timeout=datetime.timedelta(seconds=seconds))
    store = dist.distributed_c10d.PrefixStore(
        f"clusterrun-smoke/{os.environ.get('CLUSTERRUN_RUN_ID', '')}", store)
    if store.add("joined", 1) == world:
        store.set("all-joined", "1")
    store.wait(["all-joined"])
    return store


def interface_address(name):
    """The IPv4 address of interface ``name`` (SIOCGIFADDR), or None."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", os.fsencode(name)[:15]))
    except OSError:
        return None
    finally:
        sock.close()
    return socket.inet_ntoa(packed[20:24])


def _accept_all(listener):
    while True:
        try:
            conn, _peer = listener.accept()
        except OSError:
            return
        conn.close()


def check_pairs(store, rank, world, seconds):
    """Every rank listens on an ephemeral port of its GLOO_SOCKET_IFNAME address, as Gloo and
    NCCL do, and connects to every other rank's at once. Returns the failed pairs as
    [source node, target node, target address, error], the same list on every rank."""
    node = os.environ.get("CLUSTERRUN_NODE") or socket.gethostname()
    addr = interface_address(os.environ.get("GLOO_SOCKET_IFNAME") or "")
    listener, port = None, None
    if addr is not None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((addr, 0))
        listener.listen(max(world, 16))
        threading.Thread(target=_accept_all, args=(listener,), daemon=True).start()
        port = listener.getsockname()[1]
    store.set(f"addr/{rank}", json.dumps([node, addr, port]))
    store.wait([f"addr/{r}" for r in range(world)])
    peers = [json.loads(store.get(f"addr/{r}")) for r in range(world) if r != rank]
    failed = [[node, peer, f"{ip}:{port_}", error]
              for peer, ip, port_, error in _connect_all(peers, addr, seconds)]
    store.set(f"blocked/{rank}", json.dumps(failed))
    store.wait([f"blocked/{r}" for r in range(world)])
    everyone = [pair for r in range(world) for pair in json.loads(store.get(f"blocked/{r}"))]
    if listener is not None:
        listener.close()
    return everyone


def _connect_all(peers, src, seconds):
    """(node, address, port, error) for each peer no TCP connection reached in ``seconds``."""
    selector = selectors.DefaultSelector()
    failed = []
    for peer, ip, port in peers:
        if ip is None or src is None:
            continue  # no interface address to test from or to: Gloo will say what is wrong
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.bind((src, 0))
        code = sock.connect_ex((ip, port))
        if code in (0, errno.EINPROGRESS):
            selector.register(sock, selectors.EVENT_WRITE, (peer, ip, port))
        else:
            failed.append((peer, ip, port, os.strerror(code)))
            sock.close()
    deadline = time.monotonic() + seconds
    while selector.get_map() and time.monotonic() < deadline:
        for key, _events in selector.select(deadline - time.monotonic()):
            sock = key.fileobj  # type: ignore[assignment]  # only sockets are registered
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                failed.append((*key.data, os.strerror(code)))
            selector.unregister(sock)
            sock.close()
    for key in list(selector.get_map().values()):
        failed.append((*key.data, f"timed out after {seconds:g} s"))
        selector.unregister(key.fileobj)
        key.fileobj.close()  # type: ignore[union-attr]  # only sockets are registered
    selector.close()
    return failed


def describe(blocked, world):
    """What rank 0 prints when some pairs cannot connect: every failed pair, by node name."""
    lines = [f"smoke: {len(blocked)} of {world * (world - 1)} connections between ranks failed "
             "(TCP to an ephemeral port on the chosen interface, as Gloo and NCCL connect):"]
    lines += [f"smoke:   {src} -> {dst} ({where}): {why}" for src, dst, where, why in blocked]
    lines.append("smoke: the collective would hang until its timeout. NCCL and Gloo connect "
                 "every pair of ranks on ephemeral ports (net.ipv4.ip_local_port_range), not "
                 "only the master port: open that range between the hosts (a firewall may have "
                 "changed since the preflight checks passed).")
    return "\n".join(lines)


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
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = join(dist, rank, world, JOIN_SECONDS)
    blocked = check_pairs(store, rank, world, min(PAIR_SECONDS, CONNECT_SECONDS))
    if blocked:
        if rank == 0:
            print(describe(blocked, world), flush=True)
        else:
            time.sleep(1)  # rank 0, which names every pair, ends first: the root cause
        return 3
    # Everyone is here and every pair connects: from now on a collective that takes longer
    # than CONNECT_SECONDS is broken, not slow to start.
    dist.init_process_group(backend, store=dist.distributed_c10d.PrefixStore("pg", store),
                            rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=CONNECT_SECONDS))
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
        # Hundreds of MB on a slow link take longer than a broken collective may: a group of
        # its own with a timeout to match.
        group = dist.new_group(timeout=datetime.timedelta(seconds=BANDWIDTH_SECONDS))
        nbytes, seconds = timed_allreduce(dist, torch, device, args.bandwidth_bytes, use_cuda,
                                          group=group)
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
