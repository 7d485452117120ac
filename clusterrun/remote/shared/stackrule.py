"""Where a rank's Python stack waits (stdlib only, Python 3.6+): for its peers (a torch.distributed
collective, DDP's backward) or for its DataLoader. The rule both ends read stacks by: the
supervisor's progress and profile on the hosts (stacks taken by remote/hostlib/pystack.py), the
stall report, and the controller's `stacks` view.
"""

from typing import Optional, Sequence

from clusterrun.remote.shared import userframe
from clusterrun.remote.shared.userframe import Frame, Thread

# torch.distributed calls a rank waits in while its peers have not arrived (the "waiting group"
# of a stall). A frame of one of these in torch/distributed marks the rank as waiting.
COLLECTIVES = frozenset((
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "wait", "_wait", "batch_isend_irecv",
    "new_group", "init_process_group", "_store_based_barrier", "get", "wait_for_workers",
))
# A rank whose main thread is idle (py-spy's per-thread flag: not running) with one of these
# innermost waits for its peers with no collective of its own on the stack: DDP's reducer
# all-reduces the gradients from autograd's hooks and the main thread waits for it inside the
# backward pass (torch/autograd); FSDP and others wait on a work handle in torch/distributed.
# The same frames while the thread runs are computing (a CPU backward runs on the caller).
BACKWARD = frozenset(("_engine_run_backward", "run_backward", "backward"))
# A main thread idle under these waits for a batch from its DataLoader's worker processes.
DATALOADER = "torch/utils/data/"

def peer_wait(frames: Sequence[Frame], active: Optional[bool] = None) -> Optional[str]:
    """Where a stack (frames outermost first, ``function`` and ``file`` each) waits for the
    rank's peers, or None. A collective or barrier of torch.distributed on the stack, running
    or not (NCCL's waiters may spin); or, with the thread idle (``active`` False), an innermost
    frame in the backward pass (DDP's gradient all-reduce) or in torch.distributed (a work
    handle's wait: FSDP)."""
    for frame in reversed(frames):
        if (frame["function"].rsplit(".", 1)[-1] in COLLECTIVES
                and "torch/distributed" in frame["file"]):
            return str(frame["function"])
    if active is False and frames:
        inner = frames[-1]
        name = inner["function"].rsplit(".", 1)[-1]
        if "torch/autograd/" in inner["file"] and name in BACKWARD:
            return "backward (DDP's gradient all-reduce)"
        if "torch/distributed/" in inner["file"]:
            return str(inner["function"])
    return None


def data_wait(frames: Sequence[Frame], active: Optional[bool] = None) -> bool:
    """Whether an idle stack waits for a batch from its DataLoader's worker processes."""
    return active is False and any(DATALOADER in f["file"] for f in frames)


def waiting_in(threads: Sequence[Thread]) -> Optional[str]:
    """Where a rank's main thread waits for its peers (``peer_wait``), or None."""
    main = userframe.main_thread(threads)
    if main is None:
        return None
    return peer_wait(main.get("frames") or [], main.get("active"))
