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
from fsframework.models.argrc_blocks import continued_inclusive_prefixes, sharded_inclusive_prefixes
from fsframework.models.argrc_cache import ScanDecodeCache
from fsframework.models.blocks import dropout
from fsframework.models.context import DocumentRows, after_earlier
from fsframework.models.documents import Documents
from fsframework.models.language_model import LanguageModel
from fsframework.models.recompute import recomputed, wants_recompute
from fsframework.ops.dispatch import kernel_for
from fsf_kernels.common.tree_tables import TreeTables, tree_tables
from fsframework.ops.scan import exclusive_scan, packed_exclusive_scan, row_tiled

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
    leaves `0..t`); with a `shard`, those of this rank's slice under sequence parallelism; with
    `documents`, of each packed document from its own start (`fsframework.models.documents`: every
    document's tree in one packed tree, `packed`, inside this one call); `rows` (document masking under
    sequence parallelism): where a run's first piece that continues a document gets the roots of the
    document's earlier blocks (`rows.earlier_roots`, `continued_inclusive_prefixes`).

    Why one module call: ZeRO-3 gathers a module's parameters at every call of it, with a
    collective over all ranks. The ranks of a sequence-parallel group apply the cell different
    numbers of times (their slices cut into different trees; with document masking, their rows
    hold documents of different lengths), so per-application gathers would not pair up across ranks. DeepSpeed is told to treat this module as a leaf (the
    model's `zero3_leaf_modules`): the cell's parameters are gathered once when the scan starts and
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

    def forward(self, h: torch.Tensor, identity: torch.Tensor, shard: Optional[ShardOfSequence] = None,
                documents: Optional[Documents] = None, rows: Optional[DocumentRows] = None) -> torch.Tensor:
        if documents is not None:
            received, known = (None, []) if rows is None else rows.earlier_roots(h, self.combine())

            def continue_piece(i: int, piece: torch.Tensor, start: int) -> torch.Tensor:
                return continued_inclusive_prefixes(known[i], piece, start, self.combine(), identity.to(h.dtype))

            prefixes = documents.map_packed(lambda flat: self.packed(flat, identity, documents), h, continue_piece)
            return prefixes if received is None else after_earlier(prefixes, received)
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

    def packed(self, flat: torch.Tensor, identity: torch.Tensor, documents: Documents) -> torch.Tensor:
        """The inclusive prefixes of packed documents `flat` `[P, D]` (`documents.plain_lengths`, end to
        end), each from its own start: every document's tree in one packed tree (`packed_exclusive_scan`,
        `2 * ceil(log2 (L + 1))` cell calls for the longest document `L`, however many there are)."""
        tables = documents.derived("tree_scan", lambda: PackedScanTables.of(documents.plain_lengths, flat.device))
        # each document's leaves and a zero row: the exclusive scan of L + 1 rows, row 0 dropped
        leaves = torch.cat((flat, flat.new_zeros(1, flat.shape[1])))[tables.leaf_source]
        identity = identity.to(flat.dtype)
        impl = self.attention_cfg.impl
        kernel = kernel_for("grc_scan", "grc_packed_exclusive_scan", impl, flat,
                            scan_unsupported(flat.dtype, flat.shape[-1]))
        fused = isinstance(self.cell, GRCCell)
        if kernel is not None and not fused and impl == "triton":
            raise ValueError("model.attention.impl=triton: the Triton tree scan implements the GRC cell only; "
                             "use impl=auto or reference with model.argrc.cell=mlp")
        if kernel is not None and fused:
            values = kernel(leaves, tables.tree, self.cell, identity)
        else:
            values = packed_exclusive_scan(leaves, tables.tree, self.combine(), identity)
        return values[tables.prefix_rows]


class PackedScanTables(NamedTuple):
    """The gathers of `TreeScan.packed` for documents of given lengths, built once per batch."""

    tree: TreeTables  # the packed tree of the documents' L + 1 rows each
    leaf_source: torch.Tensor  # `[R0]`: each leaf's row of `cat(flat, zero row)`
    prefix_rows: torch.Tensor  # `[P]`: each token's inclusive prefix, a row of the scan's output

    @staticmethod
    def of(lengths: list[int], device) -> "PackedScanTables":
        lengths_t = torch.tensor(lengths, dtype=torch.long)
        total = int(lengths_t.sum())
        rows = lengths_t + 1
        firsts = torch.cumsum(rows, 0) - rows  # each document's first leaf row
        document = torch.repeat_interleave(torch.arange(len(lengths)), rows)
        j = torch.arange(int(rows.sum())) - firsts[document]
        token_firsts = torch.cumsum(lengths_t, 0) - lengths_t
        leaf_source = torch.where(j < lengths_t[document], token_firsts[document] + j, torch.full_like(j, total))
        # token t of document d is output row firsts[d] + 1 + t = (token index) + d + 1
        prefix_rows = torch.arange(total) + torch.repeat_interleave(torch.arange(len(lengths)), lengths_t) + 1
        return PackedScanTables(tree_tables(rows).to(device), leaf_source.to(device, non_blocking=True),
                                prefix_rows.to(device, non_blocking=True))


class ARGRCLanguageModel(LanguageModel):
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
                if isinstance(module, nn.Linear) and module.bias is not None:
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

    def inclusive_prefixes(self, h: torch.Tensor, documents: Optional[Documents] = None) -> torch.Tensor:
        """`[B, T, D]` -> `[B, T, D]`: row `t` covers leaves `0..t` (of its own document, with `documents`).
        `model.attention.impl` picks the Triton tree kernel or the reference."""
        return self.scan(h, self.identity, documents=documents)

    # --- the language-model interface (`fsframework.models.language_model`) ---

    def hidden_states(self, tokens: torch.Tensor, *, documents: Optional[Documents] = None) -> torch.Tensor:
        """tokens `[B, T]` -> final hidden states `[B, T, E]`; with `documents`, the scan restarts at each
        packed document's start (each is scanned as a row of its own, `fsframework.models.documents`)."""
        return self.readout(self.inclusive_prefixes(self.leaves(tokens), documents))

    def decode_state(self, chunk: Optional[int] = None) -> ScanDecodeCache:
        """The cached-decoding form (`fsframework.models.argrc_cache`); `chunk`: prefill positions per step."""
        return ScanDecodeCache(self, chunk)

    def sequence_parallel_hidden_states(self, tokens: torch.Tensor, sp, rows: Optional[DocumentRows] = None
                                        ) -> torch.Tensor:
        """This rank's slice of the sequence `sp`: its own scan, the block roots of the other ranks
        gathered by the parallelism (`fsframework.parallel.scan`). With `rows` (document masking) each
        document is scanned from its own start: a run's first piece that continues a document reads
        the roots of the document's earlier blocks, reduced by the ranks that hold their leaves
        (`rows.earlier_roots`, `fsframework.parallel.document_roots`)."""
        if rows is None:
            return self.sharded_hidden_states(tokens, sp.slices, sp.rank, self.parallelism.root_gatherer(sp))
        h = self.leaves(tokens)  # the scan exchanges continued documents' roots on every rank, inside its one call
        return self.readout(self.scan(h, self.identity, documents=rows.documents, rows=rows))

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

    def enable_activation_checkpointing(self) -> None:
        self.activation_checkpointing = True

    def recomputed_blocks(self) -> list[nn.Module]:
        """The cell: each of its calls, one per tree level, is recomputed."""
        return [self.cell]

    def zero3_leaf_modules(self, documents: bool = False) -> list[type]:
        """The scan: its ranks apply the cell different numbers of times (`TreeScan`), with or without
        `documents`."""
        return [TreeScan]

    def shape_summary(self) -> str:
        return f", d_model {self.cfg.d_model}"  # no layers


def _cell_under_scan(module, state_dict, prefix, *_) -> None:
    """Weights saved before the cell moved under `scan` (`cell.*` -> `scan.cell.*`) still load."""
    for key in [k for k in state_dict if k.startswith(prefix + "cell.")]:
        state_dict[prefix + "scan." + key[len(prefix):]] = state_dict.pop(key)
