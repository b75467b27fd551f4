"""Running top-K over score tiles, kept in registers (`@triton.jit` helpers).

A running set is a pair of `[BM, KP]` tiles (values, cell ids), `KP` a power
of two >= K. Slots < K start empty (-inf, id BIG); slots >= K hold +inf so they
are never the weakest and never replaced. Ties go to the smaller cell id
everywhere, matching the reference's "earlier cell wins".
"""

import triton
import triton.language as tl

BIG = tl.constexpr(2147483647)


@triton.jit
def topk_init(BM: tl.constexpr, KP: tl.constexpr, K: tl.constexpr):
    cols = tl.arange(0, KP)[None, :] + tl.zeros([BM, KP], tl.int32)
    run_v = tl.where(cols < K, float("-inf"), float("inf"))
    run_i = tl.full([BM, KP], BIG, tl.int32)
    return run_v, run_i


@triton.jit
def topk_merge(run_v, run_i, s, idx, K: tl.constexpr, KP: tl.constexpr):
    """Merge score tile s `[BM, BC]` (-inf = unavailable) with cell ids idx into the running set.

    Each round moves every row's best remaining entry in if it beats the row's weakest kept one.
    Rounds stop as soon as no row took an entry, or no row has an entry that could beat its
    weakest: an entry that cannot enter now never can, since a row's best remaining only falls
    and its weakest kept only rises. Far into a long prefix most tiles hold nothing that enters,
    so most tiles cost one pass over s instead of K rounds of five (the scorer's time at 64k+
    went mostly to these rounds). At most K rounds: at most K entries of a tile can enter.
    """
    cols = tl.arange(0, KP)[None, :]
    best_v = tl.max(s, 1)
    worst_v = tl.min(run_v, 1)
    go = _any_may_enter(best_v, worst_v)
    rounds = 0
    # a loop, not unrolled: unrolling K rounds of reductions made the scorer's compile time grow
    # with K (about 100 s at K = 16 on sm_80)
    while go > 0:
        best_i = tl.min(tl.where(s == best_v[:, None], idx, BIG), 1)
        worst_i = tl.max(tl.where(run_v == worst_v[:, None], run_i, -1), 1)
        take = (best_v > float("-inf")) & ((best_v > worst_v) | ((best_v == worst_v) & (best_i < worst_i)))
        # empty slots tie with each other: replace only the first of them
        hit = (run_v == worst_v[:, None]) & (run_i == worst_i[:, None])
        col = tl.min(tl.where(hit, cols, KP), 1)
        put = take[:, None] & (cols == col[:, None])
        run_v = tl.where(put, best_v[:, None], run_v)
        run_i = tl.where(put, best_i[:, None], run_i)
        s = tl.where(take[:, None] & (idx == best_i[:, None]), float("-inf"), s)
        rounds += 1
        took = tl.max(take.to(tl.int32), 0)
        best_v = tl.max(s, 1)
        worst_v = tl.min(run_v, 1)
        go = took * _any_may_enter(best_v, worst_v) * (rounds < K).to(tl.int32)
    return run_v, run_i


@triton.jit
def _any_may_enter(best_v, worst_v):
    """1 if some row's best remaining entry is at least its weakest kept one (ties are settled by
    id in the round), else 0."""
    return tl.max(((best_v >= worst_v) & (best_v > float("-inf"))).to(tl.int32), 0)


@triton.jit
def topk_sorted(run_v, run_i, K: tl.constexpr, KP: tl.constexpr):
    """Ids in descending score (ties: smaller id first) as `[BM, KP]`; -1 for empty slots and slots >= K."""
    cols = tl.arange(0, KP)[None, :]
    run_v = tl.where(cols < K, run_v, float("-inf"))
    out = tl.full(run_i.shape, -1, tl.int32)
    for t in range(K):
        v = tl.max(run_v, 1)
        i = tl.min(tl.where(run_v == v[:, None], run_i, BIG), 1)
        out = tl.where(cols == t, tl.where(v > float("-inf"), i, -1)[:, None], out)
        run_v = tl.where((run_v == v[:, None]) & (run_i == i[:, None]), float("-inf"), run_v)
    return out
