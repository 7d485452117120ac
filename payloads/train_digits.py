"""Minimal, copyable DistributedDataParallel (DDP) training script.

It trains a small MLP on scikit-learn's bundled 8x8 ``digits`` dataset (no download, works
offline) and shows the practices every multi-GPU guide teaches, in one readable file:

* rank / local rank / world size come from the environment that ``torchrun`` sets;
* NCCL when this rank has a GPU, Gloo otherwise; ``torch.cuda.set_device(local_rank)``;
* BatchNorm converted to SyncBatchNorm on GPU (plain BatchNorm on CPU, see ``build_model``);
* ``DistributedSampler`` for train (shuffled, ``set_epoch`` every epoch) and for eval;
* metrics all-reduced across ranks (sum of correct / sum of total), printed by rank 0;
* a checkpoint written by rank 0 only (atomically), then ``dist.barrier()``;
* restartable: with ``--resume``, or when the launcher says this is a restart
  (``CLUSTERRUN_RESTART_COUNT`` / ``TORCHELASTIC_RESTART_COUNT`` > 0), rank 0 loads the
  checkpoint (model, optimizer, epoch, RNG state) and broadcasts it; the shuffle of each epoch
  comes from (seed, epoch), so a resumed run ends with the same parameters as an
  uninterrupted one (``final parameter sha256 ...``);
* a final ``dist.barrier()``, ``destroy_process_group()``, exit code 0 on success.

Run it on one machine with two processes (CPU/Gloo works fine)::

    torchrun --nproc-per-node 2 payloads/train_digits.py
    torchrun --nproc-per-node 2 payloads/train_digits.py --resume --epochs 12

on every host of an inventory with clusterrun::

    clusterrun launch inventories/localhost.yaml payloads/train_digits.py

or, without a launcher, as a single process (world size 1)::

    python payloads/train_digits.py

``--dataset mnist`` trains on MNIST via torchvision instead (needs torchvision and internet
on the first run; local rank 0 of each node downloads, the others wait at a barrier).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# Next to the script: under clusterrun that is also the working directory on every host.
HERE = Path(__file__).resolve().parent
DEFAULT_CHECKPOINT_DIR = HERE / "checkpoints"
DEFAULT_DATA_DIR = HERE / "data"


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=["digits", "mnist"], default="digits")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="MNIST files")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    p.add_argument(
        "--lr",
        type=float,
        default=0.05,
        help="SGD learning rate for the *global* batch (batch-size x world size); scale it "
        "linearly if you change the number of ranks a lot",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", type=Path, default=DEFAULT_CHECKPOINT_DIR)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint if any (implied when CLUSTERRUN_RESTART_COUNT or "
        "TORCHELASTIC_RESTART_COUNT is above 0)",
    )
    p.add_argument("--no-checkpoint", action="store_true", help="do not write checkpoints")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    p.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- process group


def say(msg: str) -> None:
    """One write per line, so lines of ranks sharing a pipe or terminal never interleave."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def setup(args: argparse.Namespace) -> tuple[int, int, int, torch.device, str]:
    """Read rank info from torchrun's environment and join the process group."""
    if "RANK" not in os.environ:  # plain `python train_digits.py`: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank = int(os.environ["RANK"])  # global rank, 0 .. world_size-1
    local_rank = int(os.environ["LOCAL_RANK"])  # rank on this host = GPU index
    world_size = int(os.environ["WORLD_SIZE"])

    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > local_rank
    backend = args.backend if args.backend != "auto" else ("nccl" if has_gpu else "gloo")
    if backend == "nccl":
        if not has_gpu:
            sys.exit(f"rank {rank}: --backend nccl but no GPU for local rank {local_rank}")
        # Before any CUDA work: otherwise every rank piles onto GPU 0.
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    # Printed before joining, so a rank stuck at rendezvous still shows that it started.
    say(
        f"rank {rank}/{world_size} local_rank {local_rank} on {socket.gethostname()} "
        f"backend {backend} device {device} pid {os.getpid()}"
    )
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=args.timeout_s),
    )
    return rank, local_rank, world_size, device, backend


def barrier(device: torch.device) -> None:
    # With NCCL, name the device so the barrier does not guess (and warn about) one.
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def shutdown(device: torch.device, backend: str) -> None:
    """Leave the job cleanly: a final barrier, then destroy the process group."""
    barrier(device)  # nobody tears down while a peer is still talking to it
    dist.destroy_process_group()
    if backend == "gloo":
        # Gloo caveat (seen with torch 2.13): destroy_process_group() leaves Gloo's worker
        # threads running, and one may still be releasing the last collective's tensors,
        # which takes the GIL. If the interpreter is already exiting, that thread is killed
        # and the process aborts ("terminate called without an active exception"): about 2%
        # of 2-rank CPU runs that exit right after evaluating. Giving up the GIL briefly
        # lets the thread finish first.
        time.sleep(0.05)


# --------------------------------------------------------------------------------- data


def _standardize(x_train: torch.Tensor, x_test: torch.Tensor) -> tuple[torch.Tensor, ...]:
    mean = x_train.mean(0, keepdim=True)
    std = x_train.std(0, keepdim=True).clamp_min(1e-3)  # constant border pixels in digits
    return (x_train - mean) / std, (x_test - mean) / std


def load_digits_data(seed: int) -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    # Every rank must build the *same* split: fixed random_state, no per-rank randomness.
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    xt_tr, xt_te = _standardize(
        torch.as_tensor(x_tr, dtype=torch.float32), torch.as_tensor(x_te, dtype=torch.float32)
    )
    return (
        TensorDataset(xt_tr, torch.as_tensor(y_tr, dtype=torch.long)),
        TensorDataset(xt_te, torch.as_tensor(y_te, dtype=torch.long)),
    )


def load_mnist_data(
    data_dir: Path, local_rank: int, device: torch.device
) -> tuple[TensorDataset, TensorDataset]:
    try:
        from torchvision import datasets
    except ImportError:
        sys.exit("--dataset mnist needs torchvision: pip install torchvision (or use digits)")

    # One download per host: local rank 0 fetches, everybody else waits, then all read it.
    # (Every rank must reach the barrier, whichever branch it takes.) If --data-dir is on a
    # filesystem shared by all hosts, download on global rank 0 only instead.
    if local_rank == 0:
        datasets.MNIST(data_dir, train=True, download=True)
        datasets.MNIST(data_dir, train=False, download=True)
    barrier(device)
    train = datasets.MNIST(data_dir, train=True, download=False)
    test = datasets.MNIST(data_dir, train=False, download=False)
    x_tr, x_te = _standardize(
        train.data.flatten(1).float() / 255.0, test.data.flatten(1).float() / 255.0
    )
    return TensorDataset(x_tr, train.targets), TensorDataset(x_te, test.targets)


# -------------------------------------------------------------------------------- model


def build_model(in_features: int, num_classes: int, device: torch.device) -> nn.Module:
    model: nn.Module = nn.Sequential(
        nn.Linear(in_features, 128),
        nn.BatchNorm1d(128),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(128, 64),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )
    if device.type == "cuda":
        # SyncBatchNorm computes batch statistics over the global batch (all ranks), not
        # each rank's small slice of it.
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    # On CPU we keep plain BatchNorm: SyncBatchNorm is GPU-only. Checked on torch 2.13 with
    # gloo: DDP(...) refuses it ("SyncBatchNorm layers only work with GPU modules") and
    # SyncBatchNorm.forward raises for CPU tensors. Per-rank BN statistics are fine at this
    # batch size; DDP (broadcast_buffers=True) copies rank 0's running stats to all ranks at
    # every forward, so the ranks' models stay identical.
    return model.to(device)


# -------------------------------------------------------------------------- checkpoints

# clusterrun sets the first on every rank of a restarted run; torchrun sets the second when it
# restarts its workers itself (--max-restarts). Both are 0 (or unset) on the first attempt.
RESTART_COUNT_VARS = ("CLUSTERRUN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


def restart_count() -> int:
    """0 on a first attempt, k on the k-th restart, whichever launcher restarted us."""
    count = 0
    for name in RESTART_COUNT_VARS:
        value = os.environ.get(name, "").strip()
        if not value:
            continue
        try:
            count = max(count, int(value))
        except ValueError:
            sys.exit(f"{name}={value!r} is not a whole number")
    return count


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's random state. Dropout masks come from it, and DataLoader draws a seed from
    it every epoch; the shuffle does not (DistributedSampler derives it from seed and epoch).
    The script uses neither numpy's nor Python's global RNG: save those too if yours does."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def gather_rng_states(device: torch.device, rank: int, world_size: int) -> Optional[list[Any]]:
    """Every rank's random state, on rank 0 (None elsewhere). Collective: all ranks call it.
    The ranks' streams need not be identical, so rank 0's own state alone would not do."""
    states: Optional[list[Any]] = [None] * world_size if rank == 0 else None
    dist.gather_object(rng_state(device), states, dst=0)
    return states


def _fsync_dir(directory: Path) -> None:
    # The rename is only durable once the directory entry is on disk too. Windows cannot
    # open a directory for fsync.
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    path: Path,
    model: DistributedDataParallel,
    opt: torch.optim.Optimizer,
    epoch: int,
    *,
    rng_states: Optional[list[Any]],
    args: argparse.Namespace,
) -> None:
    """Rank 0 only. A crash at any point leaves either the previous checkpoint or this one,
    never half a file: write a temp file next to it, fsync, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as the target: os.replace is atomic only within one filesystem.
    tmp = path.with_name(path.name + ".tmp")
    state = {
        "model": model.module.state_dict(),  # .module: no "module." prefix in the keys
        "optimizer": opt.state_dict(),
        "epoch": epoch,  # epochs completed
        "rng": rng_states,  # one entry per rank, indexed by global rank
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def load_checkpoint(path: Path, rank: int) -> Optional[dict[str, Any]]:
    """Rank 0 reads the file and broadcasts it, so only rank 0's host needs to have it
    (no shared filesystem required) and every rank resumes from the very same epoch.
    For big models, put the checkpoint on shared storage and load it on every rank with
    ``map_location`` instead."""
    box: list[Optional[dict[str, Any]]] = [None]
    if rank == 0 and path.is_file():
        box[0] = torch.load(path, map_location="cpu", weights_only=True)
    dist.broadcast_object_list(box, src=0)
    return box[0]


def resume(
    path: Path,
    model: DistributedDataParallel,
    opt: torch.optim.Optimizer,
    device: torch.device,
    seed: int,
) -> int:
    """Load model, optimizer and RNG state if a checkpoint exists; return epochs already done."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    ckpt = load_checkpoint(path, rank)
    if ckpt is None:
        if rank == 0:
            say(f"no checkpoint at {path}, starting from scratch")
        return 0
    model.module.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    epoch = int(ckpt["epoch"])
    states = ckpt.get("rng")
    note = ""
    if states is not None and len(states) == world_size:
        set_rng_state(states[rank], device)
    else:
        # Saved by another number of ranks (e.g. a restart with fewer nodes): their streams do
        # not map onto ours. Still deterministic, though not the uninterrupted run's numbers
        # (those depend on the world size anyway: it sets the global batch).
        torch.manual_seed(seed + epoch)
        saved = "it holds no RNG state" if states is None else f"saved by {len(states)} ranks"
        note = f" ({saved}, {world_size} now: RNG reseeded from seed and epoch)"
    if rank == 0:
        say(f"resumed from {path} after epoch {epoch}{note}")
    return epoch


def crash_for_tests(epochs_done: int, rank: int, restarts: int) -> None:
    """Testing aid: TRAIN_DIGITS_CRASH_AFTER_EPOCH=k makes rank TRAIN_DIGITS_CRASH_RANK
    (default 1) die right after the checkpoint of epoch k is on disk, on the first attempt
    only, so a restart test can kill a run at a known point and expect the restart to finish."""
    after = os.environ.get("TRAIN_DIGITS_CRASH_AFTER_EPOCH", "").strip()
    if restarts > 0 or not after or int(after) != epochs_done:
        return
    if rank == int(os.environ.get("TRAIN_DIGITS_CRASH_RANK", "1")):
        sys.stderr.write(
            f"rank {rank}: TRAIN_DIGITS_CRASH_AFTER_EPOCH={after}: exiting with code 1 "
            "(testing aid)\n"
        )
        sys.stderr.flush()
        os._exit(1)  # no cleanup, no barrier: as abrupt as a lost process


def parameter_digest(model: nn.Module) -> str:
    """sha256 over the bytes of every parameter and buffer (BatchNorm running statistics),
    in state_dict order: equal digests mean bitwise-equal models."""
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        # Viewed as bytes so any dtype (bfloat16 too) hashes without numpy knowing it.
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        h.update(raw.numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------- train / evaluate


def train_one_epoch(
    model: nn.Module, loader: DataLoader, opt: torch.optim.Optimizer, device: torch.device
) -> float:
    model.train()
    loss_fn = nn.CrossEntropyLoss()
    stats = torch.zeros(2, dtype=torch.float64, device=device)  # [loss sum, samples]
    for xb, yb in loader:
        x, y = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
        stats[0] += loss.detach() * y.numel()
        stats[1] += y.numel()
    dist.all_reduce(stats, op=dist.ReduceOp.SUM)  # one sync per epoch, not per step
    return float(stats[0] / stats[1])


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    sampler: DistributedSampler,
    n_total: int,
    device: torch.device,
) -> float:
    """Exact accuracy over the whole test set, whatever the number of ranks.

    Each rank scores its shard; correct and total counts are summed over ranks. The
    DistributedSampler pads the index list (repeating samples) so all shards are equally
    long; the padded ones are the last positions of some shards and are not counted.
    The bare module (``model.module``) is used so eval runs no collective in forward.
    """
    model.eval()
    n_valid = len(range(sampler.rank, n_total, sampler.num_replicas))  # unpadded share
    stats = torch.zeros(2, dtype=torch.float64, device=device)  # [correct, total]
    seen = 0
    for xb, yb in loader:
        keep = max(0, min(yb.numel(), n_valid - seen))
        seen += yb.numel()
        if keep == 0:
            continue
        x, y = xb[:keep].to(device, non_blocking=True), yb[:keep].to(device, non_blocking=True)
        stats[0] += (model(x).argmax(1) == y).sum()
        stats[1] += keep
    dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    return float(stats[0] / stats[1])


# --------------------------------------------------------------------------------- main


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    rank, local_rank, world_size, device, backend = setup(args)
    torch.manual_seed(args.seed)  # same init everywhere (DDP also broadcasts rank 0's weights)

    if args.dataset == "digits":
        train_ds, test_ds = load_digits_data(args.seed)
    else:
        train_ds, test_ds = load_mnist_data(args.data_dir, local_rank, device)
    in_features = train_ds.tensors[0].shape[1]

    # Each rank sees a disjoint 1/world_size slice of the data every epoch.
    train_sampler = DistributedSampler(train_ds, shuffle=True, seed=args.seed)
    test_sampler = DistributedSampler(test_ds, shuffle=False)
    pin = device.type == "cuda"
    # shuffle must be left False (the default) when a sampler is given.
    train_loader = DataLoader(
        train_ds, batch_size=args.batch_size, sampler=train_sampler, pin_memory=pin
    )
    test_loader = DataLoader(test_ds, batch_size=256, sampler=test_sampler, pin_memory=pin)

    net = build_model(in_features, 10, device)

    def wrap() -> DistributedDataParallel:
        ids = [local_rank] if device.type == "cuda" else None
        return DistributedDataParallel(net, device_ids=ids)

    model = wrap()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)

    ckpt_path = args.checkpoint_dir / f"{args.dataset}_ddp.pt"
    restarts = restart_count()
    start_epoch = 0
    if args.resume or restarts > 0:
        start_epoch = resume(ckpt_path, model, opt, device, args.seed)

    if rank == 0 and start_epoch < args.epochs:
        say(
            f"training {args.dataset}: {len(train_ds)} train / {len(test_ds)} test samples, "
            f"{world_size} ranks x batch {args.batch_size}, "
            f"epochs {start_epoch + 1}..{args.epochs}"
        )

    acc = float("nan")
    for epoch in range(start_epoch, args.epochs):
        if epoch > start_epoch:
            # A fresh DDP wrapper every epoch, as a restarted run has for its first one. DDP
            # lays its gradient buckets out anew after its first step, and with three or more
            # ranks the order in which the all-reduce adds the ranks' gradients follows that
            # layout; without this a run resumed at an epoch boundary would differ from one
            # that never stopped in the last bits. The old wrapper must be gone first: its
            # hooks would still fire on the same parameters.
            del model
            gc.collect()
            model = wrap()
        train_sampler.set_epoch(epoch)  # else every epoch reuses the same shuffle
        loss = train_one_epoch(model, train_loader, opt, device)
        acc = evaluate(model.module, test_loader, test_sampler, len(test_ds), device)
        # Taken where the next epoch would start: nothing draws random numbers from here on.
        rng_states = None if args.no_checkpoint else gather_rng_states(device, rank, world_size)
        if rank == 0:
            say(f"epoch {epoch + 1}/{args.epochs} loss {loss:.4f} test accuracy {acc:.4f}")
            if not args.no_checkpoint:
                save_checkpoint(ckpt_path, model, opt, epoch + 1, rng_states=rng_states, args=args)
        # Nobody starts the next epoch (or exits, or reads the file) before it is written.
        barrier(device)
        crash_for_tests(epoch + 1, rank, restarts)

    if start_epoch >= args.epochs:  # resumed a finished run: just report
        acc = evaluate(model.module, test_loader, test_sampler, len(test_ds), device)
        if rank == 0:
            say(f"already trained {start_epoch} epochs, nothing to do")

    if rank == 0:
        where = "" if args.no_checkpoint else f", checkpoint {ckpt_path}"
        say(
            f"final test accuracy {acc:.4f} ({max(start_epoch, args.epochs)} epochs, "
            f"{world_size} ranks, {time.perf_counter() - t0:.1f}s{where})"
        )
        say(f"final parameter sha256 {parameter_digest(model.module)}")
    shutdown(device, backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
