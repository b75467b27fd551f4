"""What each Triton kernel accepts, and its tiles per (head dim, dtype, target): torch only.

A target is a shared-memory class of GPU, named by the architecture the tiles are compiled
and checked for: 90 (232,448 B per block: H100/H200, and B200), 80 (166,912 B: A100, Jetson
Orin) and 86 (101,376 B: A10/A40/RTX 30xx, L4/L40/RTX 40xx, RTX 50xx). A device runs the
tiles of the largest target whose shared memory it has (`device_target`); a device with less
than all of them (T4, V100) runs the references.

Every `*_unsupported` function returns None when the kernel runs the call, else the reason in
words. The dispatcher (`fsframework.ops.dispatch.kernel_for`) asks it before picking a kernel:
`impl="auto"` then runs the reference, `impl="triton"` raises ValueError with the reason. The
limits are the largest configurations that `tests/kernels/test_compile_targets.py` compiles for
sm_80, sm_86 and sm_90 and finds within the target's shared memory, so an accepted call never fails at
launch for want of shared memory.

Legend: d head dim, K cells per query (top_k), P retained cells (FS-L), s cell size.
"""

from __future__ import annotations

import functools

import torch

# per-block shared memory (opt-in maximum) of each target, bytes
SHARED_LIMIT = {80: 166_912, 86: 101_376, 90: 232_448}
SMALLEST_TARGET = min(SHARED_LIMIT, key=SHARED_LIMIT.get)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
MAX_TOP_K = 64  # the routing scorer's running top-K, and the cells per query the readout reads
MAX_RETAINED = 1024  # FS-L P
MAX_NEW_CELLS = 64  # block_size / cell_size: cells that become eligible at once (FS-L retention)
MAX_CELL_SIZE = 128  # the readout's K/V tile rows
MAX_CELL_TILE = 8192  # the readout's K/V tile elements, cell size x padded head dim (32 x 256, 128 x 64)
MAX_SCAN_WIDTH = 2048  # GRC tree scan: the gates/LayerNorm kernels hold whole rows
MAX_BEAM_WIDTH = 64  # FS-B search: a program ranks 2 Wb children by [Wb, Wb] comparisons in registers
SEARCH_DTYPES = (torch.float32, torch.float64)  # FS-B searches in its summaries' dtype, fp32 or wider


def target_for_shared_memory(per_block: int) -> int | None:
    """The target with the most shared memory that `per_block` bytes hold, or None."""
    fitting = [t for t, limit in SHARED_LIMIT.items() if limit <= per_block]
    return max(fitting, key=SHARED_LIMIT.get) if fitting else None


def device_target(device: torch.device) -> int:
    """The target whose tiles a launch on `device` uses: read from the CUDA device's shared memory
    per block; 90 off the GPU (the interpreter ignores resources). A CUDA device below every target
    is refused by `device_unsupported` before any launch."""
    if device.type != "cuda":
        return 90
    return target_for_shared_memory(_shared_per_block(device)) or SMALLEST_TARGET


def device_unsupported(device: torch.device) -> str | None:
    """Why no kernel runs on `device` (too little shared memory per block), or None."""
    if device.type != "cuda":
        return None
    per_block = _shared_per_block(device)
    if target_for_shared_memory(per_block) is None:
        return (f"{torch.cuda.get_device_name(device)} ({per_block:,} B of shared memory per block; the kernels' "
                f"tiles need at least {SHARED_LIMIT[SMALLEST_TARGET]:,} B)")
    return None


def _shared_per_block(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _shared_per_block_of(index)


@functools.lru_cache(maxsize=None)
def _shared_per_block_of(index: int) -> int:
    """A CUDA device's per-block shared memory (opt-in maximum): read once, as every op call asks."""
    props = torch.cuda.get_device_properties(index)
    optin = getattr(props, "shared_memory_per_block_optin", 0)
    return int(optin or props.shared_memory_per_block)


def _dtype_unsupported(dtype: torch.dtype) -> str | None:
    if dtype not in DTYPES:
        return f"dtype {dtype} (the kernels take float32, float16, bfloat16)"
    return None


def _common(dtype: torch.dtype, dim: int) -> str | None:
    if reason := _dtype_unsupported(dtype):
        return reason
    if not 1 <= dim <= MAX_HEAD_DIM:
        return f"head dim {dim} (the kernels take 1..{MAX_HEAD_DIM})"
    return None


def routing_unsupported(dtype: torch.dtype, dim: int, config) -> str | None:
    """FS / FS-L cell routing (`fsf_kernels.cell_routing`) with the settings `config` (a
    `fsframework.ops.freesolo_config.FreeSoloConfig`)."""
    variant, top_k, retained_cells = config.variant, config.top_k, config.retained_cells
    cell_size, block_size = config.cell_size, config.block_size
    if variant not in ("fs", "fsl"):
        return f"variant {variant!r} (the kernel routes 'fs' and 'fsl')"
    if top_k > MAX_TOP_K:
        return f"top_k={top_k} (the kernel keeps at most {MAX_TOP_K})"
    if variant == "fsl" and retained_cells > MAX_RETAINED:
        return f"retained_cells={retained_cells} (the kernel retains at most {MAX_RETAINED})"
    if variant == "fsl" and block_size // cell_size > MAX_NEW_CELLS:
        return (f"block_size / cell_size = {block_size // cell_size} cells per block (FS-L retention merges at "
                f"most {MAX_NEW_CELLS})")
    return _common(dtype, dim)


def readout_unsupported(dtype: torch.dtype, dim: int, *, top_k: int, cell_size: int) -> str | None:
    """Selected-cell readout (`fsf_kernels.cell_readout`)."""
    if top_k > MAX_TOP_K:
        return f"K={top_k} cells per query (the kernel reads at most {MAX_TOP_K})"
    if cell_size > MAX_CELL_SIZE:
        return f"cell_size={cell_size} (the kernel's tiles hold at most {MAX_CELL_SIZE} tokens)"
    reason = _common(dtype, dim)
    if reason is None and padded_dim(cell_size) * padded_dim(dim) > MAX_CELL_TILE:
        # a cell's K and V tiles, pipelined, would not fit the shared memory of a block
        return (f"cell_size={cell_size} at head dim {dim} (a cell's tile, cell size x padded head dim, holds at "
                f"most {MAX_CELL_TILE} values: cell_size <= {MAX_CELL_TILE // padded_dim(dim)} at this head dim)")
    return reason


def window_unsupported(dtype: torch.dtype, dim: int, *, rope: bool) -> str | None:
    """Sliding-window attention (`fsf_kernels.window_attention`)."""
    if rope and dim % 2:
        return f"odd head dim {dim} with RoPE"
    return _common(dtype, dim)


def rewired_unsupported(dtype: torch.dtype, dim: int) -> str | None:
    """Runway-rewired attention (`fsf_kernels.rewired_attention`)."""
    return _common(dtype, dim)


def fsb_search_unsupported(dtype: torch.dtype, dim: int, *, beam_width: int) -> str | None:
    """FS-B's forest beam search (`fsf_kernels.fsb_search`)."""
    if dtype not in SEARCH_DTYPES:
        return f"dtype {dtype} (the search takes float32 and float64, the summaries' dtypes)"
    if not 1 <= dim <= MAX_HEAD_DIM:
        return f"head dim {dim} (the kernels take 1..{MAX_HEAD_DIM})"
    if not 1 <= beam_width <= MAX_BEAM_WIDTH:
        return f"beam_width={beam_width} (the kernel's beam holds 1..{MAX_BEAM_WIDTH} nodes)"
    return None


def scan_unsupported(dtype: torch.dtype, width: int) -> str | None:
    """GRC tree scan (`fsf_kernels.grc_scan`)."""
    if reason := _dtype_unsupported(dtype):
        return reason
    if not 1 <= width <= MAX_SCAN_WIDTH:
        return f"scan width {width} (the kernel takes 1..{MAX_SCAN_WIDTH})"
    return None


def padded_dim(dim: int) -> int:
    """The tile width of a head dim: a power of two, at least 16 (a `tl.dot` extent)."""
    return max(16, 1 << max(0, dim - 1).bit_length())


def readout_stages(dtype: torch.dtype, dim: int, cell_size: int, arch: int) -> int:
    """Pipeline stages of the readout kernels on target `arch`: 3, or 2 for fp32 at the largest cell
    tile, where the backward needs 167,936 B with 3 (d = 256, s = 32), over sm_80's 166,912 B;
    sm_86 (101,376 B) takes 2 from a cell tile of 2,048 values on, 1 at the largest."""
    tile = padded_dim(cell_size) * padded_dim(dim)
    if arch == 86:
        return 3 if tile < 2048 else 2 if tile < MAX_CELL_TILE else 1
    big = tile >= MAX_CELL_TILE
    return 2 if dtype == torch.float32 and big else 3


def readout_by_cell_tiles(dtype: torch.dtype, dim: int, cell_size: int, arch: int) -> tuple[int, int] | None:
    """(selections per step, pipeline stages) of the readout's by-cell dk/dv kernel on target `arch`, or
    None where a cell's tiles do not fit a block's shared memory (the backward then adds dk/dv
    atomically). It holds a cell's K and V (V in fp32) besides the gathered rows: at the largest cell
    tile it needs 172,544 B with 32 selections (bf16, d = 256), 127,232 B with 16; sm_86 (101,376 B)
    fits no variant of the bf16 or fp32 d = 256 tile, so that class adds atomically from 8,192 values on."""
    tile = padded_dim(cell_size) * padded_dim(dim)
    if tile < MAX_CELL_TILE or arch == 90:
        return 32, 3
    return (16, 3) if arch == 80 else None


def routing_cell_tile(dim: int, arch: int) -> int:
    """Cells the routing scorer scores per step: 64, or 32 at d = 256, where 64 fp32 summaries of
    256 wide, pipelined, need 262,144 B of shared memory (131,072 B at 32). sm_86 (101,376 B)
    takes 32 at d = 128 and 16 at d = 256 (131,584 B at 32 for half queries)."""
    bd = padded_dim(dim)
    if arch == 86:
        return 64 if bd <= 64 else 32 if bd <= 128 else 16
    return 64 if bd <= 128 else 32


def routing_query_rows(dim: int) -> int:
    """Most query rows a routing scorer program scores together (a block's rows share their cells):
    128 at d <= 64, where the larger tile reads each cell summary for twice the rows (FS routing 28.1
    against 32.6 ms at 256k on an H200, docs/kernels.md), 64 beyond, where a 128-row fp32 query tile
    would not fit in registers."""
    return 128 if padded_dim(dim) <= 64 else 64


def window_tiles(dtype: torch.dtype, dim: int, arch: int) -> tuple[int, int, int]:
    """(query rows, key rows, pipeline stages) of the window-attention kernels on target `arch`.

    64 x 64 tiles with 3 stages fit sm_80 and sm_90 up to d = 128 in half precision (107,520 B for
    the dk/dv kernel); at d = 256 they need 263,168 B, so sm_90 drops to 2 stages (197,120 B) and
    sm_80 to 32 x 32 tiles (100,864 B). fp32 rows are twice as wide: 64 x 64 up to d = 64
    (98,304 B), 32 x 32 beyond (102,912 B at d = 128, 135,424 B with 2 stages at d = 256).
    sm_86 (101,376 B) takes one step less where those do not fit: 2 stages for half d = 128 and
    fp32 d = 64 and 128, and 16 x 16 tiles for fp32 d = 256.
    """
    bd = padded_dim(dim)
    small = arch == 86
    if dtype == torch.float32:
        if bd <= 64:
            return (64, 64, 2) if small and bd == 64 else (64, 64, 3)
        if bd <= 128:
            return (32, 32, 2) if small else (32, 32, 3)
        return (16, 16, 2) if small else (32, 32, 2)
    if bd <= 128:
        return (64, 64, 2) if small and bd == 128 else (64, 64, 3)
    return (64, 64, 2) if arch >= 90 else (32, 32, 3)
