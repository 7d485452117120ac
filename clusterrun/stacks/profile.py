"""`stacks --profile` and `top --profile`: naming the straggler from every rank's wait share.

In a synchronous job every rank waits in each collective until the slowest has arrived, so the
slowest rank waits least. A rank is a straggler when its wait share (remote/tools/profiler.py) is at
least GAP below the median of all ranks' shares; GAP was chosen from measurements on the
namespace cluster (docs/observability.md): ranks of an even run differ by a few points, a rank
slowed by extra compute or by its host's CPU limit sits tens of points below the rest.
"""

from __future__ import annotations

import statistics

from clusterrun.stacks.model import Collected, RankStack

GAP = 0.25
MIN_SAMPLES = 20  # fewer samples than this say nothing about a rank


def judged(rank: RankStack) -> bool:
    """Whether the rank's share says anything: py-spy sampled it often enough."""
    return rank.wait_share is not None and (rank.samples or 0) >= MIN_SAMPLES


def stragglers(ranks: list[RankStack]) -> list[int]:
    """The ranks that wait least while the others wait for them; empty for an even run. A rank
    with fewer than MIN_SAMPLES samples is neither named nor counted in the median."""
    shares = {r.rank: r.wait_share for r in ranks if judged(r) and r.wait_share is not None}
    if len(shares) < 2:
        return []
    middle = statistics.median(shares.values())
    return sorted(rank for rank, share in shares.items() if middle - share >= GAP)


def lines(collected: Collected, seconds: float) -> list[str]:
    """The text `stacks --profile` prints above the stacks."""
    out = [f"wait share over {seconds:g} s (share of samples waiting for the peers: in "
           "torch.distributed collectives, or idle in DDP's backward):"]
    named = set(collected.stragglers or ())
    for rank in collected.ranks:
        share = "-" if rank.wait_share is None else f"{100 * rank.wait_share:5.1f}%"
        mark = "  <- straggler: the others wait for it" if rank.rank in named else ""
        if rank.wait_share is not None and not judged(rank):
            mark = f"  (only {rank.samples or 0} samples: too few to judge)"
        out.append(f"  rank {rank.rank:<4} {rank.node:<16} {share:>7}{mark}")
    if collected.stragglers:
        out.append("straggler: rank " + ", ".join(map(str, collected.stragglers)))
    else:
        out.append("no straggler: the ranks wait about equally")
    if collected.partial:
        out[-1] += (" (among the ranks asked only: --node/--rank; not recorded as the run's "
                    "straggler event)")
    return out
