"""Training FLOPs per token of every model kind, from its config alone (docs/training.md, "FLOPs per token").

`training_flops_per_token(model, seq_len, sp)`: the forward and backward FLOPs of one training row
of `seq_len` tokens, divided by `seq_len` (and by the `sp` ranks that share the row). A FLOP is half
a multiply-add: only matrix products and attention products count (norms, softmax, gates and
losses are elementwise and left out). Every weight product costs `2 x` its multiply-adds forward
and twice that backward (the 6N rule). An attention product costs what the implementation runs:
the score tiles it computes (a fused causal call half its square, a chunked window its chunks),
backward twice the forward plus whatever the backward recomputes (a fused call's scores, a
checkpointed tile, FreeSolo's readout logits). Each kind's term is one function below, keyed by
its name in `KIND_FLOPS`; the formulas are written out in docs/training.md.

Legend: T the row's length, L layers, D model width, H heads, d = D / H, f the SwiGLU width,
V vocabulary, w window, s cell size, B query block, K cells read per query, P / W FS-L's retained
/ recent cells.
"""

from __future__ import annotations

from typing import Callable

from fsframework.config.checks import ConfigError
from fsframework.config.kinds import kind_facts
from fsframework.config.model import ModelConfig

# backward multiply-adds per forward multiply-add of a product: its two gradients (the 6N rule)
BACKWARD = 2.0
# a fused attention call (SDPA) recomputes its scores in backward, one of its two forward products
FUSED_BACKWARD = BACKWARD + 0.5
# query chunks of the PyTorch window paths (fsframework.ops.local_attention): the reference's
# explicit softmax and the fused form `impl=auto` runs where no kernel does
WINDOW_CHUNK = {"reference": 256}
FUSED_WINDOW_CHUNK = 128
ALIBI_CHUNK = 512  # queries per call of AlibiAttention (fsframework.models.attention)
REWIRED_TILE = 128  # queries per tile of the rewired reference (fsframework.ops.rewired.QUERY_TILE)


def training_flops_per_token(model: ModelConfig, seq_len: int, sp: int = 1) -> float:
    """Forward + backward FLOPs of a training row of `seq_len` tokens of `model`, per token and per
    rank when `sp` sequence-parallel ranks share the row.

    Under sequence parallelism every rank does `1 / sp` of the row's products: the keys it receives
    from other ranks (a gather, a halo, relayed cells) are read by the same products a single rank
    would run, and what SP adds besides is communication, not products (AR-GRC's ranks recompute a
    few roots of the tree, `O(log T)` cell applications, left out)."""
    if seq_len < 1 or sp < 1:
        raise ValueError(f"seq_len={seq_len} and sp={sp} must be positive")
    facts = kind_facts(model.name)
    if not facts.trainable:
        raise ConfigError(f"model.name={model.name} is a read path only: it has no training FLOPs "
                          f"(count model.name={facts.trained_as}, which trains its weights)")
    if model.name not in KIND_FLOPS:
        raise ConfigError(f"model.name={model.name!r} has no FLOPs formula; known: {', '.join(KIND_FLOPS)}")
    if not facts.decoder_blocks:
        total = KIND_FLOPS[model.name](model, seq_len)  # a language model of its own (AR-GRC)
    else:
        total = 6.0 * dense_parameters(model) + model.n_layers * KIND_FLOPS[model.name](model, seq_len)
    return total / sp


def packed_flops_per_token(lengths: list[int], per_token: Callable[[int], float]) -> float:
    """FLOPs per token of rows whose documents (`lengths`) are read apart (document masking): each
    document costs what a row of its length costs, `per_token(L)` per token."""
    return sum(length * per_token(length) for length in lengths) / sum(lengths)


def dense_parameters(model: ModelConfig) -> int:
    """N of the 6N rule for a decoder-block model: the weights every token multiplies, per token
    (the four projections and the SwiGLU per layer, the output head; not the embedding lookup)."""
    d, f = model.d_model, model.ffn_hidden
    return model.n_layers * (4 * d * d + 3 * d * f) + d * model.vocab_size


# ---- attention terms: FLOPs per token of one layer's attention, by kind ----


def causal_fused(model: ModelConfig, seq_len: int) -> float:
    """Dense causal attention as one fused causal call (tfpp, sinusoidal; docs/baselines.md): half
    the `T x T` square of scores and values per head, `T / 2` keys per query on average."""
    forward = (seq_len / 2) * 2 * model.d_model  # scores q.k and the sum p.v, over all heads
    return 2 * forward * (1 + FUSED_BACKWARD)


def alibi(model: ModelConfig, seq_len: int) -> float:
    """ALiBi (docs/baselines.md): chunks of 512 queries over every key up to their last, each a
    fused call with an explicit bias (the whole rectangle, not half)."""
    pairs = sum((min(lo + ALIBI_CHUNK, seq_len) - lo) * min(lo + ALIBI_CHUNK, seq_len)
                for lo in range(0, seq_len, ALIBI_CHUNK))
    return 2 * (pairs / seq_len) * 2 * model.d_model * (1 + FUSED_BACKWARD)


def window_pairs(seq_len: int, window: int, impl: str) -> int:
    """Query-key pairs the window paths score (docs/freesolo.md §1.2): chunks of `C = max(chunk, w)`
    queries, each over its own chunk's keys and the previous chunk's."""
    chunk = max(WINDOW_CHUNK.get(impl, FUSED_WINDOW_CHUNK), window)
    return sum((min(lo + chunk, seq_len) - lo) * (min(lo + chunk, seq_len) - max(0, lo - chunk))
               for lo in range(0, seq_len, chunk))


def window(model: ModelConfig, seq_len: int) -> float:
    """Sliding-window attention (swa, FreeSolo's local branch; docs/freesolo.md §1.2)."""
    a = model.attention
    backward = BACKWARD if a.impl == "reference" else FUSED_BACKWARD  # explicit products or a fused call
    return 2 * (window_pairs(seq_len, a.window, a.impl) / seq_len) * 2 * model.d_model * (1 + backward)


def rewired(model: ModelConfig, seq_len: int) -> float:
    """Rewired attention (docs/rewired.md §2-§3): causal tiles of 128 queries over every key up to
    their last; each pair adds the runway bias `r_t . u_m` (d, shared by the heads) to the H scores
    and values. Each tile is checkpointed: backward recomputes its logits (scores and bias, not the
    values' sum, which backward does not need)."""
    dm, d = model.d_model, model.head_dim
    pairs = sum((min(lo + REWIRED_TILE, seq_len) - lo) * min(lo + REWIRED_TILE, seq_len)
                for lo in range(0, seq_len, REWIRED_TILE)) / seq_len
    tiles = pairs * ((dm + dm + d) * (1 + BACKWARD) + dm + d)
    bilinear = d * d if model.attention.rewired.score == "bilinear" else 0  # r_t Bmat
    return 2 * (tiles + bilinear * (1 + BACKWARD))


def freesolo_routing_cells(model: ModelConfig, seq_len: int) -> int:
    """Cells scored by the queries of a row, summed over queries (docs/freesolo.md §1.4-§1.5): every
    query of block `b` scores its available cells, all `bB / s` eligible ones (FS) or the retained
    and recent ones (FS-L: up to P + W).

    Summed in closed form over the query blocks `b = 1 .. J` after the first (which has no cell;
    the blocks routing walks, `fsframework.ops.freesolo_routing.query_blocks`, not imported: this
    module reads only the config). Block `b` has `B` queries, the last `T - J B`; with B a multiple
    of s (checked by the config) it sees `b c` eligible cells, `c = B / s`; FS-L keeps `min(P, b c)`
    retained and `min(W, b c)` recent ones (the state `admit_fsl` keeps: the top P of kept + new,
    the last W of recent + new)."""
    a = model.attention
    block, per_block = a.block_size, a.block_size // a.cell_size
    blocks = max(0, -(-seq_len // block) - 1)  # J: query blocks that start before seq_len, after the first
    if blocks == 0:
        return 0
    if kind_facts(model.name).routing == "fsl":
        every = _capped_sum(a.retained_cells, per_block, blocks) + _capped_sum(a.recent_cells, per_block, blocks)
        last = min(a.retained_cells, blocks * per_block) + min(a.recent_cells, blocks * per_block)
    else:
        every, last = per_block * blocks * (blocks + 1) // 2, blocks * per_block
    # every block's B queries, less the ones the last block lacks
    return block * every - (block * (blocks + 1) - seq_len) * last


def _capped_sum(cap: int, step: int, count: int) -> int:
    """`sum_{b=1}^{count} min(cap, b step)` for `step >= 1`: the first `cap // step` terms are `b step`."""
    uncapped = min(count, cap // step)
    return step * uncapped * (uncapped + 1) // 2 + cap * (count - uncapped)


def freesolo(model: ModelConfig, seq_len: int) -> float:
    """FS and FS-L (docs/freesolo.md §1.2-§1.7): the local window; routing, every query against its
    available cells' mean keys (forward only: selections get no gradient); the readout of K cells of
    s tokens per query, whose backward recomputes its logits; the combine's own weights."""
    a, dm = model.attention, model.d_model
    routing = (freesolo_routing_cells(model, seq_len) / seq_len) * dm
    readout = a.top_k * a.cell_size * 2 * dm * (1 + BACKWARD + 0.5)
    combine = {"sum": 0, "gate": dm * model.n_heads, "separate_wo": dm * dm}[a.combine] * (1 + BACKWARD)
    return window(model, seq_len) + 2 * (routing + readout + combine)


def argrc_cell_applications(seq_len: int) -> int:
    """Cell applications of the exclusive tree scan over `T + 1` rows (docs/argrc.md §2): the up-sweep
    combines the pairs of every level, the down-sweep every right child (`fsframework.ops.scan`)."""
    rows = seq_len + 1
    total, level = 0, rows
    while level >= 2:
        level //= 2
        total += level
    for height in range(max(rows - 1, 0).bit_length() - 1, -1, -1):
        total += -(-rows // 2**height) // 2
    return total


def argrc(model: ModelConfig, seq_len: int) -> float:
    """AR-GRC (docs/argrc.md §1-§4), the whole model: Linear(E -> D), the optional post-embedding MLP,
    ~2T applications of the cell (GRC: W1 2D x 4D, W2 4D x 4D; the MLP cell: W2 4D x D; plus the
    optional post-merge MLP), Linear(D -> E) and the output head, all at 6 FLOPs per weight."""
    g, e = model.argrc, model.d_model
    dim = g.d_state or e
    cell = 2 * dim * 4 * dim + 4 * dim * (4 * dim if g.cell == "grc" else dim) + 2 * dim * g.post_merge_mlp_hidden
    per_token = e * dim + 2 * dim * g.post_embed_mlp_hidden + dim * e + e * model.vocab_size
    return 6.0 * (per_token + cell * argrc_cell_applications(seq_len) / seq_len)


# each trainable kind's term, by name: one layer's attention for a decoder-block kind (the blocks'
# weights are the 6N of `dense_parameters`), the whole model for a language model of its own (AR-GRC)
KIND_FLOPS: dict[str, Callable[[ModelConfig, int], float]] = {
    "tfpp": causal_fused,
    "sinusoidal": causal_fused,
    "alibi": alibi,
    "swa": window,
    "rewired": rewired,
    "fs": freesolo,
    "fsl": freesolo,
    "argrc": argrc,
}
