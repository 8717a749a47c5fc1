"""Agreeing across the ranks of a distributed job: a stop is taken at the same step on every rank,
or the collective save that follows would hang."""

from __future__ import annotations

import sys


def max_across_ranks(value: int) -> int:
    """The largest ``value`` any rank passes (a signal number, 0 for none). One tiny all-reduce when
    torch.distributed is running with more than one rank; otherwise ``value`` itself, and torch is
    not imported by this."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return value
    on_gpu = "nccl" in str(dist.get_backend()) and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
