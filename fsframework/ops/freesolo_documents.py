"""FreeSolo's long-range branch over packed documents in one call (docs/freesolo.md §1.12).

Legend: B rows, T positions, H heads, d head width, s cell size, BLK query block, R laid-out rows.

With document masking every document is read as a row of its own: its cells and query blocks
start at its first token. Only a document longer than a query block reads anything long range
(a first block has no cell before it: its long-range output is exactly zero). Those documents are
laid end to end in one row, each from a query-block boundary, with zero rows after it up to the
next boundary; their cells and blocks are then the row's cells and blocks. Routing is told, per
query block, the first cell of the block's document (`first_cells`, `select_cells`): a block scores
only its own document's cells and FS-L's history restarts at each document; the erf prior reads
positions only as `i - p_c`, which a shift by whole cells keeps. The readout reads the selected
cells by their row index and is the row's op, unchanged. So every FreeSolo op runs once for all the
documents of a micro-batch (one launch each with the kernels), instead of once per distinct
length, on at most `BLK - 1` padding rows per long document.

The layout (`DocumentBlocks`) is built on the host from the documents' positions, once per batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from fsframework.ops.freesolo import cell_readout, select_cells, unit_gradient_gain
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior
from fsframework.ops.freesolo_readout import chunk_queries


@dataclass
class DocumentBlocks:
    """Where the long documents of packed rows go in the laid-out row (module docstring)."""

    length: int  # R: the laid-out row's length, a multiple of the block (0: no document reads long range)
    gather: torch.Tensor  # [R]: each laid-out row's packed token (flat `row * T + t`), or `B T` for padding
    back: torch.Tensor  # [B T]: each packed token's laid-out row, or R for a token with no long range
    first_cells: torch.Tensor  # [R / BLK] on the CPU: each query block's document's first cell

    @staticmethod
    def of(host_positions: torch.Tensor, block_size: int, cell_size: int, device) -> "DocumentBlocks":
        """The layout of rows whose tokens sit at document positions `host_positions` `[B, T]` (CPU,
        every row beginning a document)."""
        if block_size % cell_size:
            raise ValueError(f"block_size={block_size} must be a multiple of cell_size={cell_size}")
        flat = host_positions.reshape(-1)
        total = flat.numel()
        starts = (flat == 0).nonzero().squeeze(1)
        lengths = torch.diff(starts, append=starts.new_tensor([total]))
        long = lengths > block_size
        starts, lengths = starts[long], lengths[long]
        padded = -torch.div(-lengths, block_size, rounding_mode="floor") * block_size
        laid = torch.cumsum(padded, 0) - padded  # each long document's first laid-out row
        length = int(padded.sum())
        document = torch.repeat_interleave(torch.arange(starts.numel()), padded)
        offset = torch.arange(length) - laid[document]  # position inside the document
        gather = torch.where(offset < lengths[document], starts[document] + offset, torch.full_like(offset, total))
        back = torch.full((total,), length, dtype=torch.long)
        real = gather < total
        back[gather[real]] = torch.arange(length)[real]
        first_cells = (laid[document] // cell_size)[::block_size].contiguous()
        return DocumentBlocks(length, gather.to(device, non_blocking=True), back.to(device, non_blocking=True),
                              first_cells)


def packed_long_range(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: DocumentBlocks,
                      cfg: FreeSoloConfig, prior: RoutingPrior, gain: Optional[torch.Tensor]) -> torch.Tensor:
    """The long-range branch `[B, T, H, d]` of unrotated q, k, v `[B, T, H, d]` of packed rows laid out by
    `blocks`, every document read as a row of its own (module docstring): routing with `first_cells`,
    the readout and its RMSNorm gain (`gain` `[H, d]`, `cfg.readout_backward`) as `freesolo` reads a row."""
    shape = q.shape
    if blocks.length == 0:  # no document reaches a second block: nothing long range anywhere
        zero = q.new_zeros(shape)
        # the gain stays in the graph with a zero gradient, as a first block's readout keeps it
        return zero if gain is None else zero + 0 * gain.sum().to(q.dtype)
    pad = q.new_zeros((1, *shape[2:]))
    q, k, v = (torch.cat((x.reshape(-1, *shape[2:]), pad))[blocks.gather][None] for x in (q, k, v))
    cells = select_cells(q, k, cfg, prior, first_cells=blocks.first_cells)
    # the reference readout's chunks no longer than the packed rows' (its budget is shared by their B
    # rows, and no chunk spans two rows): a chunk's union of cells then spans no more documents than a
    # chunk of a packed row does
    chunk = min(shape[1], chunk_queries(shape[0], shape[2], cfg.top_k, cfg.cell_size, shape[3]))
    if cfg.readout_backward == "unit" and gain is not None:  # learns as if read at gain 1 (docs/freesolo.md §1.6)
        long_range = unit_gradient_gain(cell_readout(q, k, v, cells, cfg, chunk=chunk), gain)
    else:
        long_range = cell_readout(q, k, v, cells, cfg, rms_weight=gain, chunk=chunk)
    return torch.cat((long_range[0], pad))[blocks.back].view(shape)
