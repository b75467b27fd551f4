"""AR-GRC: the log-depth recurrent language model (docs/argrc.md).

tokens -> embedding (E) -> LayerNorm -> Linear(E -> D) -> optional residual MLP -> leaves
`h` (D); an exclusive tree scan (`fsframework.ops.scan`) composes the leaves with a learned
cell from a root value `e` (learned or zeros); the prefix covering tokens `0..t` is
projected by Linear(D -> E) and decoded with the (tied) embedding matrix to predict token
`t + 1`. No positional encoding: the tree is the only notion of order.

Legend: B batch, T time, E embedding width (`model.d_model`), D scan width
(`model.argrc.d_state`), V vocab, M rows of one cell call.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from fsf_kernels.common.support import scan_unsupported
from fsframework.config import ModelConfig
from fsframework.models.blocks import dropout
from fsframework.models.losses import head_output
from fsframework.models.recompute import recomputed, wants_recompute
from fsframework.ops.dispatch import kernel_for
from fsframework.ops.scan import down_sweep, exclusive_scan, row_tiled, up_sweep

# The widest intermediate of one reference cell call (its `[rows, 4D]` hidden layer) is kept
# to this many bytes when no backward follows: it stays in a core's L2 cache and under the
# allocator's fresh-mapping threshold (`fsframework.ops.scan.row_tiled`, docs/argrc.md §8).
CELL_TILE_BYTES = 2 * 2**20


class ResidualMLP(nn.Module):
    """`x + W2 GELU(W1 x + b1) + b2`, position-wise (docs/argrc.md §1, §3)."""

    def __init__(self, dim: int, hidden: int, p: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(F.gelu(self.fc1(x))))


class GRCCell(nn.Module):
    """The gated recursive cell `op(a, b)` (docs/argrc.md §3):

        [g_a, g_b, g_c, c] = W2 GELU(W1 [a; b] + b1) + b2
        m = LayerNorm(sigmoid(g_a) a + sigmoid(g_b) b + sigmoid(g_c) c)
        op(a, b) = m + PostMLP(m)   (m alone without a post-merge network)

    No dropout inside: the cell is the same function wherever it runs (the scan, the
    decode cache, the levels that sequence-parallel ranks compute redundantly).
    """

    def __init__(self, dim: int, post_merge_hidden: int, eps: float):
        super().__init__()
        self.dim = dim
        self.w1 = nn.Linear(2 * dim, 4 * dim)
        self.w2 = nn.Linear(4 * dim, 4 * dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.post = ResidualMLP(dim, post_merge_hidden) if post_merge_hidden else None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a, b `[M, D]` -> `[M, D]`."""
        g_a, g_b, g_c, c = self.w2(F.gelu(self.w1(torch.cat((a, b), dim=-1)))).chunk(4, dim=-1)
        m = self.norm(torch.sigmoid(g_a) * a + torch.sigmoid(g_b) * b + torch.sigmoid(g_c) * c)
        return self.post(m) if self.post is not None else m


class MLPCell(nn.Module):
    """The MLP-operator ablation (docs/argrc.md §3, our reading of an unpublished form):
    `LayerNorm(W2 GELU(W1 [a; b] + b1) + b2)`, `W1: 2D -> 4D`, `W2: 4D -> D`, then the same
    post-merge network as the GRC."""

    def __init__(self, dim: int, post_merge_hidden: int, eps: float):
        super().__init__()
        self.w1 = nn.Linear(2 * dim, 4 * dim)
        self.w2 = nn.Linear(4 * dim, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.post = ResidualMLP(dim, post_merge_hidden) if post_merge_hidden else None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        m = self.norm(self.w2(F.gelu(self.w1(torch.cat((a, b), dim=-1)))))
        return self.post(m) if self.post is not None else m


class ShardOfSequence(NamedTuple):
    """What a sequence-parallel rank's scan needs besides its leaves (docs/argrc.md §6)."""

    slices: list[tuple[int, int]]  # every rank's `(start, end)` of the sequence
    rank: int  # which of them is this rank's
    gather_roots: Callable[[torch.Tensor], list[torch.Tensor]]  # own `[K, B, D]` -> every rank's `[K_r, B, D]`


class TreeScan(nn.Module):
    """Every application of the cell in one forward pass, as one call of this module.

    `forward(h [B, n, D], identity [D]) -> [B, n, D]`: the inclusive prefixes (row `t` covers
    leaves `0..t`); with a `shard`, those of this rank's slice under sequence parallelism.

    Why one module call: ZeRO-3 gathers a module's parameters at every call of it, with a
    collective over all ranks. The ranks of a sequence-parallel group apply the cell different
    numbers of times (their slices cut into different trees), so per-application gathers
    would not pair up across ranks. DeepSpeed is told to treat this module as a leaf (the
    registry entry's `zero3_leaf_modules`): the cell's parameters are gathered once when the scan starts and
    once for its backward, the same calls on every rank. The Triton tree kernel reads the
    cell's weights directly, which needs the same.
    """

    activation_checkpointing = False  # recompute each cell call in backward (fsframework.models.recompute)

    def __init__(self, cell: nn.Module, attention_cfg):
        super().__init__()
        self.cell = cell
        self.attention_cfg = attention_cfg  # its `impl` picks the Triton tree kernel or the reference

    def combine(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The cell, as the reference scan applies it: one call per tree level, which keeps only
        its `[M, D]` output and recomputes its hidden layer when activations are recomputed.
        Without autograd (evaluation, decoding) a level runs in cache-sized row tiles."""
        if wants_recompute(self):
            return lambda a, b: recomputed(self.cell, a, b)
        if not torch.is_grad_enabled():
            return row_tiled(self.cell, self.tile_rows())
        return self.cell

    def tile_rows(self) -> int:
        """Rows per tile of a cell call without autograd: its `4D`-wide hidden layer in
        `CELL_TILE_BYTES`, at least 64 rows (a matmul too thin wastes the weights' reads)."""
        hidden = self.cell.w1.out_features
        itemsize = self.cell.w1.weight.element_size()
        return max(64, CELL_TILE_BYTES // (hidden * itemsize))

    def forward(self, h: torch.Tensor, identity: torch.Tensor, shard: Optional[ShardOfSequence] = None) -> torch.Tensor:
        identity = identity.to(h.dtype)
        if shard is not None:
            return sharded_inclusive_prefixes(h, self.combine(), identity, shard.slices, shard.rank,
                                              shard.gather_roots)
        # the exclusive scan of T + 1 rows, dropping row 0; row T of an exclusive scan never
        # reads leaf T, so a zero row stands there
        padded = torch.cat((h, h.new_zeros(h.shape[0], 1, h.shape[2])), dim=1)
        impl = self.attention_cfg.impl
        kernel = kernel_for("grc_scan", "grc_exclusive_scan", impl, h, scan_unsupported(h.dtype, h.shape[-1]))
        fused = isinstance(self.cell, GRCCell)  # what the kernel implements
        if kernel is not None and not fused and impl == "triton":
            raise ValueError("model.attention.impl=triton: the Triton tree scan implements the GRC cell only; "
                             "use impl=auto or reference with model.argrc.cell=mlp")
        if kernel is not None and fused:
            return kernel(padded, self.cell, identity)[:, 1:]
        return exclusive_scan(padded, self.combine(), identity)[:, 1:]


class ARGRCLanguageModel(nn.Module):
    """`model.name=argrc`. `forward(tokens [B, T]) -> logits [B, T, V]`, logits at `t` from the
    prefix covering tokens `0..t` (the exclusive prefix at `t + 1`); the prefix at 0 (the root
    value alone) is never scored (docs/argrc.md §4)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        g = cfg.argrc
        width, state = cfg.d_model, g.d_state or cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, width)
        self.embed_drop = dropout(cfg.dropout)
        self.in_norm = nn.LayerNorm(width, eps=cfg.norm_eps)
        self.in_proj = nn.Linear(width, state)
        self.post_embed = ResidualMLP(state, g.post_embed_mlp_hidden, cfg.dropout) if g.post_embed_mlp_hidden else None
        cell = GRCCell if g.cell == "grc" else MLPCell
        self.scan = TreeScan(cell(state, g.post_merge_mlp_hidden, cfg.norm_eps), cfg.attention)
        if g.identity == "learned":
            self.identity = nn.Parameter(torch.empty(state))
        else:  # not in the state dict: nothing to learn or load
            self.register_buffer("identity", torch.zeros(state), persistent=False)
        self.out_drop = dropout(cfg.dropout)
        self.out_proj = nn.Linear(state, width)
        self.lm_head = nn.Linear(width, cfg.vocab_size, bias=False)
        self.reset_parameters()
        self.register_load_state_dict_pre_hook(_cell_under_scan)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """Linear/Embedding weights N(0, init_std), zero biases, LayerNorms at identity; a learned
        root value N(0, 1), the scale of a LayerNorm output like every composed value."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        if isinstance(self.identity, nn.Parameter):
            with torch.no_grad():
                self.identity.normal_()

    # --- the pieces, shared by the full pass, the decode cache and sequence parallelism ---

    @property
    def cell(self) -> nn.Module:
        return self.scan.cell

    @property
    def activation_checkpointing(self) -> bool:
        """Recompute each cell call of the scan in backward (fsframework.models.recompute); the
        Triton tree kernel keeps no hidden layer anyway."""
        return self.scan.activation_checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, on: bool) -> None:
        self.scan.activation_checkpointing = on

    @property
    def combine(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """One application of the cell (decoding folds it itself; training goes through `scan`)."""
        return self.scan.cell

    def leaves(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens `[B, n]` -> scan inputs `[B, n, D]` (position-wise: any slice of a sequence)."""
        h = self.in_proj(self.in_norm(self.embed_drop(self.embed(tokens))))
        return self.post_embed(h) if self.post_embed is not None else h

    def readout(self, prefixes: torch.Tensor) -> torch.Tensor:
        """Prefix states `[B, n, D]` -> final hidden states `[B, n, E]` (the lm_head's input)."""
        return self.out_proj(self.out_drop(prefixes))

    def inclusive_prefixes(self, h: torch.Tensor) -> torch.Tensor:
        """`[B, T, D]` -> `[B, T, D]`: row `t` covers leaves `0..t`. `model.attention.impl` picks
        the Triton tree kernel or the reference."""
        return self.scan(h, self.identity)

    # --- the language-model interface of the registry's models ---

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens `[B, T]` -> final hidden states `[B, T, E]`."""
        return self.readout(self.inclusive_prefixes(self.leaves(tokens)))

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None,
                loss_chunk: int = 0) -> torch.Tensor:
        """tokens `[B, T]` -> logits `[B, T, V]`; given `targets` `[B, T]`, their per-token losses
        `[B, T]` instead, the head run `loss_chunk` positions at a time (`models.losses.head_output`)."""
        return head_output(self.lm_head, self.hidden_states(tokens), targets, loss_chunk)

    def make_decode_cache(self, chunk: Optional[int] = None) -> "ScanDecodeCache":
        """The cached-decoding form (`fsframework.models.decode_cache.decode_cache` asks for it);
        `chunk`: prefill positions per step."""
        return ScanDecodeCache(self, chunk)

    def sharded_hidden_states(self, tokens: torch.Tensor, slices: list[tuple[int, int]], rank: int,
                              gather_roots: Callable[[torch.Tensor], list[torch.Tensor]]) -> torch.Tensor:
        """Sequence parallelism (docs/argrc.md §6): this rank's hidden states `[B, e - s, E]` for
        its slice `(s, e) = slices[rank]` of a sequence, from its own tokens `[B, e - s]`, equal to
        the single-process ones.

        gather_roots: `[K, B, D]` (this rank's block roots) -> the list over ranks of every
        rank's `[K_r, B, D]` (the communication, supplied by `fsframework.parallel`).
        """
        start, end = slices[rank]
        if tokens.shape[1] != end - start:
            raise ValueError(f"rank {rank} holds positions [{start}, {end}), got {tokens.shape[1]} tokens")
        h = self.leaves(tokens)
        return self.readout(self.scan(h, self.identity, ShardOfSequence(slices, rank, gather_roots)))


def _cell_under_scan(module, state_dict, prefix, *_) -> None:
    """Weights saved before the cell moved under `scan` (`cell.*` -> `scan.cell.*`) still load."""
    for key in [k for k in state_dict if k.startswith(prefix + "cell.")]:
        state_dict[prefix + "scan." + key[len(prefix):]] = state_dict.pop(key)


# --- sequence parallelism: the math; the communication is the caller's ---

def aligned_blocks(start: int, end: int) -> list[tuple[int, int]]:
    """`[start, end)` as the fewest aligned dyadic blocks `(first, size)`, left to right
    (`size` a power of two dividing `first`): at most `2 log2(end - start) + 2` of them."""
    blocks, pos = [], start
    while pos < end:
        size = pos & -pos if pos else 1 << (end - 1).bit_length()
        while pos + size > end:
            size //= 2
        blocks.append((pos, size))
        pos += size
    return blocks


def sharded_inclusive_prefixes(h: torch.Tensor, combine, identity: torch.Tensor, slices: list[tuple[int, int]],
                               rank: int, gather_roots) -> torch.Tensor:
    """`inclusive_prefixes` of the slice `slices[rank]` of a sequence from its leaves `h` only
    (docs/argrc.md §6). Each rank cuts its slice into aligned blocks and reduces them; ranks
    exchange those roots (D numbers per block and sequence); every root of a larger aligned
    block before the slice is then computed redundantly from them, the prefix at each local
    block start is the fold over its dyadic blocks, and the down-sweep inside a block is local.
    """
    start, end = slices[rank]
    local = aligned_blocks(start, end)
    levels = [up_sweep(h[:, first - start:first - start + size], combine) for first, size in local]
    own_roots = torch.stack([lv[-1][:, 0] for lv in levels]) if levels else h.new_zeros(0, h.shape[0], h.shape[2])
    gathered = gather_roots(own_roots)
    known: dict[tuple[int, int], torch.Tensor] = {}
    for r, (s, e) in enumerate(slices):
        # this rank's own roots too come from the gather: every rank's backward then runs the
        # gather's backward, which returns the other ranks' gradients on its roots
        for i, block in enumerate(aligned_blocks(s, e)):
            known[block] = gathered[r][i]
    return prefixes_of_slice(combine, identity, h.shape[0], start, local, levels, known)[0]


def prefixes_of_slice(combine, identity: torch.Tensor, batch: int, start: int, local: list[tuple[int, int]],
                      levels: list[list[torch.Tensor]], known: dict[tuple[int, int], torch.Tensor]):
    """The inclusive prefixes `[batch, n, D]` of the positions `[start, start + n)` cut into the aligned
    blocks `local` with their up-sweep `levels`, given `known`: the roots of aligned blocks, at
    least those that tile `[0, start)` and the local ones. Also returns `root(first, size)`,
    which computes (and keeps in `known`) the root of any aligned block inside
    `[0, start + n)` from its halves."""
    end = start + sum(size for _, size in local)

    def root(first: int, size: int) -> torch.Tensor:
        if (first, size) not in known:  # a block over several known blocks: from its halves
            half = size // 2
            known[(first, size)] = combine(root(first, half), root(first + half, half))
        return known[(first, size)]

    def prefix(position: int) -> torch.Tensor:
        value, first = identity.expand(batch, -1), 0
        for bit in reversed(range(position.bit_length())):
            if position >> bit & 1:
                value = combine(value, root(first, 1 << bit))
                first += 1 << bit
        return value

    parts = [down_sweep(lv, combine, prefix(first)) for lv, (first, _) in zip(levels, local)]
    exclusive = torch.cat(parts + [prefix(end)[:, None]], dim=1)  # exclusive prefixes at start .. end
    return exclusive[:, 1:], root


class ScanDecodeCache:
    """Cached decoding for AR-GRC (docs/argrc.md §5): the roots of the completed dyadic blocks
    of the tokens seen so far, largest first (a binary counter: at most log2(T) + 1 of them).
    A new token pushes its leaf and merges equal-sized blocks; its prefix is the fold of the
    cell over the stack from the root value. O(log T) cell calls and memory per token.

    Several tokens at once (a prompt) run `chunk` positions at a time as a slice of the tree,
    as a sequence-parallel rank runs its slice (§6) with the stack's roots standing in for the
    earlier ranks': no step holds more than one chunk's up-sweep.

    Same interface as `fsframework.models.decode_cache.DecodeCache`: `forward(tokens [B, n])`
    at positions `[length, length + n)` -> final hidden states `[B, n, E]`.
    """

    def __init__(self, model: ARGRCLanguageModel, chunk: Optional[int] = None):
        from fsframework.models.decode_cache import PREFILL_CHUNK

        self.model = model
        self.chunk = PREFILL_CHUNK if chunk is None else chunk
        if self.chunk < 1:
            raise ValueError(f"the prefill chunk must be >= 1 positions, got {self.chunk}")
        self.length = 0
        self.blocks: list[tuple[int, torch.Tensor]] = []  # (size, root [B, D]), sizes decreasing

    @property
    def start(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        """Bytes of the stack of block roots."""
        return sum(root.numel() * root.element_size() for _, root in self.blocks)

    def _push(self, leaf: torch.Tensor) -> None:
        self.blocks.append((1, leaf))
        while len(self.blocks) >= 2 and self.blocks[-1][0] == self.blocks[-2][0]:
            (size, right), (_, left) = self.blocks.pop(), self.blocks.pop()
            self.blocks.append((2 * size, self.model.combine(left, right)))

    def _state(self, batch: int) -> torch.Tensor:
        value = self.model.identity.expand(batch, -1)
        for _, root in self.blocks:
            value = self.model.combine(value, root.to(value.dtype))
        return value

    def _slice(self, h: torch.Tensor) -> torch.Tensor:
        """Prefixes `[B, n, D]` of leaves `h` at `[length, length + n)`; the stack then covers them."""
        combine, start = self.model.combine, self.length
        known, first = {}, 0
        for size, root in self.blocks:  # the stack tiles [0, start) with aligned blocks
            known[(first, size)] = root.to(h.dtype)
            first += size
        local = aligned_blocks(start, start + h.shape[1])
        levels = [up_sweep(h[:, f - start:f - start + size], combine) for f, size in local]
        for block, lv in zip(local, levels):
            known[block] = lv[-1][:, 0]
        prefixes, root = prefixes_of_slice(combine, self.model.identity.to(h.dtype), h.shape[0], start, local, levels,
                                           known)
        self.blocks = [(size, root(f, size)) for f, size in aligned_blocks(0, start + h.shape[1])]
        return prefixes

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """tokens `[B, n]` -> hidden states `[B, n, E]` (`last_only`: `[B, 1, E]`)."""
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be [B, n] with n >= 1, got {tuple(tokens.shape)}")
        out = []
        for at in range(0, tokens.shape[1], self.chunk):
            h = self.model.leaves(tokens[:, at:at + self.chunk])
            if h.shape[1] == 1:  # one token: push its leaf, fold the stack
                self._push(h[:, 0])
                prefixes = self._state(h.shape[0])[:, None]
            else:
                prefixes = self._slice(h)
            self.length += h.shape[1]
            out.append(self.model.readout(prefixes[:, -1:] if last_only else prefixes))
        return out[-1] if last_only else torch.cat(out, dim=1)
