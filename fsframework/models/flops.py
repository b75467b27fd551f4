"""Training and inference FLOPs per token of every model kind, from its config alone (docs/training.md,
"FLOPs per token").

`training_flops_per_token(model, seq_len, sp)`: the forward and backward FLOPs of one training row
of `seq_len` tokens, divided by `seq_len` (and by the `sp` ranks that share the row). A FLOP is half
a multiply-add: only matrix products and attention products count (norms, softmax, gates and
losses are elementwise and left out). Every weight product costs `2 x` its multiply-adds forward
and twice that backward (the 6N rule). An attention product costs what the implementation runs:
the score tiles it computes (a fused causal call half its square, a chunked window its chunks),
backward twice the forward plus whatever the backward recomputes (a fused call's scores, a
checkpointed tile, FreeSolo's readout logits). Each kind's term is one function below, keyed by
its name in `KIND_FLOPS`; the formulas are written out in docs/training.md.

`inference_flops_per_token(model, seq_len)`: the forward alone of a row read whole, `2N` plus each
term at `train=False`, for every kind: the trainable kinds' forward share (exact), and FS-B's read
path (`fsb`), an upper bound on its data-dependent search and rescoring.

Legend: T the row's length, L layers, D model width, H heads, d = D / H, f the SwiGLU width,
V vocabulary, w window, s cell size, B query block, K cells read per query, P / W FS-L's retained
/ recent cells, Wb FS-B's beam width, F its forests per head.
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


def inference_flops_per_token(model: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs of one row of `seq_len` tokens of `model` read whole (no gradient), per token:
    `2N` for the weights and each layer's attention forward (a trainable kind: the forward share of
    its training count; FS-B: `fsb`, an upper bound on its data-dependent search and rescoring)."""
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len} must be positive")
    facts = kind_facts(model.name)
    if model.name not in INFERENCE_FLOPS:
        raise ConfigError(f"model.name={model.name!r} has no FLOPs formula; known: {', '.join(INFERENCE_FLOPS)}")
    term = INFERENCE_FLOPS[model.name]
    if not facts.decoder_blocks:
        return term(model, seq_len, False)
    return 2.0 * dense_parameters(model) + model.n_layers * term(model, seq_len, False)


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


def _passes(backward: float, train: bool) -> float:
    """Multiply-adds of a product per forward multiply-add: with its `backward` in training, 1 at
    inference (the forward alone)."""
    return 1 + backward if train else 1.0


def causal_fused(model: ModelConfig, seq_len: int, train: bool = True) -> float:
    """Dense causal attention as one fused causal call (tfpp, sinusoidal; docs/baselines.md): half
    the `T x T` square of scores and values per head, `T / 2` keys per query on average."""
    forward = (seq_len / 2) * 2 * model.d_model  # scores q.k and the sum p.v, over all heads
    return 2 * forward * _passes(FUSED_BACKWARD, train)


def alibi(model: ModelConfig, seq_len: int, train: bool = True) -> float:
    """ALiBi (docs/baselines.md): chunks of 512 queries over every key up to their last, each a
    fused call with an explicit bias (the whole rectangle, not half)."""
    pairs = sum((min(lo + ALIBI_CHUNK, seq_len) - lo) * min(lo + ALIBI_CHUNK, seq_len)
                for lo in range(0, seq_len, ALIBI_CHUNK))
    return 2 * (pairs / seq_len) * 2 * model.d_model * _passes(FUSED_BACKWARD, train)


def window_pairs(seq_len: int, window: int, impl: str) -> int:
    """Query-key pairs the window paths score (docs/freesolo.md §1.2): chunks of `C = max(chunk, w)`
    queries, each over its own chunk's keys and the previous chunk's."""
    chunk = max(WINDOW_CHUNK.get(impl, FUSED_WINDOW_CHUNK), window)
    return sum((min(lo + chunk, seq_len) - lo) * (min(lo + chunk, seq_len) - max(0, lo - chunk))
               for lo in range(0, seq_len, chunk))


def window(model: ModelConfig, seq_len: int, train: bool = True) -> float:
    """Sliding-window attention (swa, FreeSolo's local branch; docs/freesolo.md §1.2)."""
    a = model.attention
    backward = BACKWARD if a.impl == "reference" else FUSED_BACKWARD  # explicit products or a fused call
    return 2 * (window_pairs(seq_len, a.window, a.impl) / seq_len) * 2 * model.d_model * _passes(backward, train)


def rewired(model: ModelConfig, seq_len: int, train: bool = True) -> float:
    """Rewired attention (docs/rewired.md §2-§3): causal tiles of 128 queries over every key up to
    their last; each pair adds the runway bias `r_t . u_m` (d, shared by the heads) to the H scores
    and values. Each tile is checkpointed: backward recomputes its logits (scores and bias, not the
    values' sum, which backward does not need)."""
    dm, d = model.d_model, model.head_dim
    pairs = sum((min(lo + REWIRED_TILE, seq_len) - lo) * min(lo + REWIRED_TILE, seq_len)
                for lo in range(0, seq_len, REWIRED_TILE)) / seq_len
    tiles = pairs * ((dm + dm + d) * (1 + BACKWARD) + dm + d) if train else pairs * (dm + dm + d)
    bilinear = d * d if model.attention.rewired.score == "bilinear" else 0  # r_t Bmat
    return 2 * (tiles + bilinear * _passes(BACKWARD, train))


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


def freesolo(model: ModelConfig, seq_len: int, train: bool = True) -> float:
    """FS and FS-L (docs/freesolo.md §1.2-§1.7): the local window; routing, every query against its
    available cells' mean keys (forward only: selections get no gradient); the readout of K cells of
    s tokens per query, whose backward recomputes its logits; the combine's own weights."""
    a, dm = model.attention, model.d_model
    routing = (freesolo_routing_cells(model, seq_len) / seq_len) * dm
    readout = a.top_k * a.cell_size * 2 * dm * _passes(BACKWARD + 0.5, train)
    return window(model, seq_len, train) + 2 * (routing + readout + _combine(model, train))


def _combine(model: ModelConfig, train: bool) -> float:
    """Multiply-adds per token of FreeSolo's combine weights: `W_g` (gate), `W_o^lr` (separate_wo)."""
    dm = model.d_model
    weights = {"sum": 0, "gate": dm * model.n_heads, "separate_wo": dm * dm}[model.attention.combine]
    return weights * _passes(BACKWARD, train)


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


def argrc(model: ModelConfig, seq_len: int, train: bool = True) -> float:
    """AR-GRC (docs/argrc.md §1-§4), the whole model: Linear(E -> D), the optional post-embedding MLP,
    ~2T applications of the cell (GRC: W1 2D x 4D, W2 4D x 4D; the MLP cell: W2 4D x D; plus the
    optional post-merge MLP), Linear(D -> E) and the output head, all at 6 FLOPs per weight."""
    g, e = model.argrc, model.d_model
    dim = g.d_state or e
    cell = 2 * dim * 4 * dim + 4 * dim * (4 * dim if g.cell == "grc" else dim) + 2 * dim * g.post_merge_mlp_hidden
    per_token = e * dim + 2 * dim * g.post_embed_mlp_hidden + dim * e + e * model.vocab_size
    return 2 * _passes(BACKWARD, train) * (per_token + cell * argrc_cell_applications(seq_len) / seq_len)


# ---- FS-B (docs/freesolo.md §1.8): the whole-sequence read path, forward only ----

# multiply-adds per cell and head width of one level of a chunk tree's split (fsframework.ops.fsb_forest.
# build_trees): two power iterations `X^T (X u)` (2 x 2) and the projection `X u` (1)
FSB_SPLIT = 5
# a search step scores the block's distinct nodes as one product while they are at most this many times
# the children slots per query (fsframework.ops.fsb_search.DISTINCT_NODES_PER_CHILD), else each query's own
FSB_DISTINCT_PER_CHILD = 2


def fsb_forest_count(model: ModelConfig) -> int:
    """Forests per head (`fsb.forests`): F0 and Ftau, or one of them."""
    return 2 if model.attention.fsb.forests == "both" else 1


def fsb_build_nodes(model: ModelConfig, seq_len: int) -> int:
    """Cell-levels of the chunk trees the forests of a row are built from, per head: the sum over the
    built trees of `n log2 n` (a tree of `n = 2^b` cells splits `b` levels of `n` cells each).

    `fsframework.ops.fsb_states.forest_states` builds every aligned chunk some block's forest holds,
    once: the chunk of `2^b` cells of a forest of `m` cells (bit `b` of `m` set) is chunk `m >> (b+1)`.
    F0 holds `j c` cells at block `j` (`c = B / s`): exact. Ftau holds a data-dependent `m_j <= j c`:
    at most `min(J, ((M - 2^b) >> (b+1)) + 1)` distinct chunks of each size, `M` the last block's
    eligible cells (an upper bound). Assumes one window of blocks (`select_cells_fsb`'s memory
    budget, 1 GiB of nodes, holds every block's forests: true but for very long rows and batches)."""
    a = model.attention
    per_block, blocks = a.block_size // a.cell_size, -(-seq_len // a.block_size)
    counts = [j * per_block for j in range(blocks)]
    most = counts[-1] if counts else 0
    total = 0
    for bit in range(max(most.bit_length(), 1)):
        size = 1 << bit
        f0 = len({m >> (bit + 1) for m in counts if m >> bit & 1})
        ftau = min(blocks, ((most - size) >> (bit + 1)) + 1) if most >= size else 0
        chunks = {"both": f0 + ftau, "f0": f0, "ftau": ftau}[a.fsb.forests]
        total += chunks * size * bit
    return total


def fsb_search_levels(cells: int, beam_width: int) -> list[int]:
    """Per ranked level of a block's search, the most nodes one query's step scores, per forest
    (`fsframework.ops.fsb_search.beam_search`, the reference path), for forests of at most `cells` cells.

    A forest of `M` cells is `ceil(log2 M)` deep. Its upper levels, where every child fits the beam,
    are walked once for all queries with no product: a level of depth `t` has at most `2^t` nodes,
    so at least `floor(log2 Wb)` levels (the exact count where M is a power of two). Each deeper level
    scores the children of the beam's inner nodes: the block's distinct children `D` (at most `2^t`
    at depth `t`) in one product when `D <= 2 x 2Wb`, else each query's `2Wb` child slots. The count
    of levels is the deepest beam's (data-dependent: at most the height) and `D` is data-dependent:
    `min(2^t, 4 Wb)` per level is an upper bound, reached by the first ranked level where M is a power
    of two and, below, when the queries' beams share few nodes; a block of distinct beams scores
    `2 Wb`."""
    height = max(cells - 1, 0).bit_length()  # ceil(log2 M)
    walked = min(height, beam_width.bit_length() - 1)  # floor(log2 Wb)
    return [min(1 << depth, 2 * FSB_DISTINCT_PER_CHILD * beam_width) for depth in range(walked + 1, height + 1)]


def fsb_block_work(model: ModelConfig, seq_len: int) -> tuple[int, int]:
    """Per head, summed over the query blocks of a row: (node scores of the search, summed over the
    queries and forests; cells rescored, summed over the queries).

    Block `j` has `Q_j` queries and `C_j = j c` eligible cells. The search: `fsb_search_levels` per
    query and forest (a block of one query scores its `2 Wb` child slots at each level). The
    rescoring (`fsframework.ops.fsb_search.rescore`) computes the log-sum-exps of the union `U_j` of
    the block's candidates for every query of the block: `U_j <= min(C_j, Q_j F min(Wb, C_j))` for
    F forests (data-dependent, reached when the queries' beams find different cells; at least one
    cell is read, a block without candidates too), `U_j = F Wb` for a block of one query (its own
    slots, pads included)."""
    a, f = model.attention, model.attention.fsb
    forests, width = fsb_forest_count(model), f.beam_width
    search = rescored = 0
    for j in range(-(-seq_len // a.block_size)):  # a sum over query blocks j (a formula, not a walk over data)
        lo = j * a.block_size
        queries, cells = min(a.block_size, seq_len - lo), lo // a.cell_size
        levels = fsb_search_levels(cells, width)
        per_query = len(levels) * 2 * width if queries == 1 else sum(levels)
        search += queries * forests * per_query
        union = forests * width if queries == 1 else max(1, min(cells, queries * forests * min(width, cells)))
        rescored += queries * union
    return search, rescored


def fsb(model: ModelConfig, seq_len: int, train: bool = False) -> float:
    """FS-B (docs/freesolo.md §1.8), the forward of one layer's attention over a whole row, per token
    (`fsframework.ops.fsb_search.select_cells_fsb`, the reference path): the local window; the
    forests' chunk trees (`fsb_build_nodes`: 5 d per cell and level); the beam search and the
    rescoring (`fsb_block_work`: d per node score, `s d` per cell rescored); the readout of
    `fsb.top_k` cells; the combine's weights. An upper bound: the search's depth and distinct nodes,
    the rescored union and Ftau's cells are data-dependent, each counted at its most (the readout as
    each query's own cells, as for FS)."""
    if train:
        raise ConfigError(f"model.name={model.name} is a read path only: it has no training FLOPs")
    readout = model.attention.fsb.top_k * model.attention.cell_size * 2 * model.d_model
    return window(model, seq_len, False) + fsb_routing(model, seq_len) + 2 * (readout + _combine(model, False))


def fsb_routing(model: ModelConfig, seq_len: int) -> float:
    """FS-B's routing (`select_cells_fsb`) of one layer, FLOPs per token, an upper bound: the chunk
    trees, the search and the rescoring, each `d` per head and node, cell level or rescored key."""
    search, rescored = fsb_block_work(model, seq_len)
    build = FSB_SPLIT * fsb_build_nodes(model, seq_len)
    return 2 * (build + search + rescored * model.attention.cell_size) * model.d_model / seq_len


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
# every kind's forward (`inference_flops_per_token`): the trainable kinds' terms at train=False, and
# the read paths'
INFERENCE_FLOPS: dict[str, Callable[..., float]] = {**KIND_FLOPS, "fsb": fsb}
