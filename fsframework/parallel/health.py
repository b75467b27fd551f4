"""A failing or hanging rank ends the job with a message naming the rank.

- Every collective runs under the process-group timeout `parallel.timeout_s`, so a
  hung peer turns into an error on the ranks waiting for it instead of a silent hang.
- `reraise_naming_rank` catches that error and asks the other ranks to check in
  through `monitored_barrier` on a separate gloo group: rank 0 learns which ranks
  never arrive and says so; every error is re-raised prefixed with the rank.

The tests inject such faults through the trainer's batch source (`tests/faults.py`).
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

_HEALTH_GROUP = None


class RankFailure(RuntimeError):
    """A rank failed or a peer stopped answering; the message names the rank(s)."""


def init_health_group(timeout_s: int) -> None:
    """A gloo group for `monitored_barrier` (collective; call once on every rank after init)."""
    import torch.distributed as dist

    global _HEALTH_GROUP
    if dist.is_initialized() and dist.get_world_size() > 1 and _HEALTH_GROUP is None:
        _HEALTH_GROUP = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def _is_communication_error(exc: BaseException) -> bool:
    import torch.distributed as dist

    text = str(exc).lower()
    return isinstance(exc, dist.DistError) or any(
        s in text for s in ("timed out", "timeout", "connection closed", "connection reset", "broken pipe"))


def _missing_ranks(timeout_s: int) -> str:
    """Which ranks fail to reach a monitored barrier (rank 0's view), as a sentence."""
    import torch.distributed as dist

    if _HEALTH_GROUP is None:
        return ""
    try:
        dist.monitored_barrier(group=_HEALTH_GROUP, timeout=timedelta(seconds=max(5, min(timeout_s, 60))),
                               wait_all_ranks=True)
    except RuntimeError as exc:
        return f"; health check: {str(exc).splitlines()[0]}"
    return "; every rank still answers the health check"


@contextmanager
def reraise_naming_rank(rank: int, world_size: int, timeout_s: int, step: int | None = None):
    """Re-raise any error of the enclosed step (`step`, when given) as RankFailure naming this rank
    (and, after a communication error, the ranks that stopped answering)."""
    try:
        yield
    except RankFailure:
        raise
    except Exception as exc:
        detail = ""
        at = f" in step {step}" if step is not None else ""
        if world_size > 1 and _is_communication_error(exc):
            detail = _missing_ranks(timeout_s)
            head = (f"rank {rank} of {world_size}: a collective{at} failed or timed out after "
                    f"parallel.timeout_s={timeout_s}s")
        else:
            head = f"rank {rank} of {world_size} failed{at}"
        raise RankFailure(f"{head}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{detail}") \
            from exc
