"""A training step's peak memory, estimated from the config before anything is built, and the
guard that refuses a run whose estimate does not fit the device (`train.memory_check`,
docs/training.md, "Memory guard").

Legend: b micro-batch rows, T the row's length (`data.seq_len`), t = b T / sp the tokens one rank
holds, L layers, D model width, f the SwiGLU width, H heads, V vocabulary, N parameters, a the
bytes of an activation element (4 in fp32, 2 in bf16), r the data-parallel ranks, w window,
c = max(chunk, w) a window chunk.

    peak = weights + gradients + optimizer state + saved activations + transient

- weights N x 4 (fp32) or N x 2 (bf16); gradients the same; optimizer state N x 8 (AdamW's two
  fp32 moments), plus under bf16 the fp32 master weights and the fp32 gradient accumulation
  (N x 8). ZeRO stage 1 divides the optimizer state by r, stage 2 the gradients too, stage 3 the
  weights too.
- saved activations, what autograd keeps for the backward pass, per decoder layer and token:
  `12 D + 3 f` elements for the block (the two RMSNorms' normalised inputs, q/k/v, the rotated
  q/k, the fused attention's output and log-sum-exp, the attention output, the SwiGLU's gate,
  its SiLU, up and product), plus the attention kind's extra:
    - full attention (tfpp, sinusoidal, rewired): none on one rank: the fused SDPA call keeps
      O(T), not the `T x T` scores; rewired's query tiles are recomputed in the backward pass
      (a transient of `3 b H 128 T` fp32 scores for one tile);
    - ALiBi: the bias of every 512-query chunk is an explicit mask `[H, 512, keys]` kept for
      the backward, `H T^2 / 2` elements per layer (per row of the batch shared): O(T^2);
    - window kinds (swa, and FreeSolo's local branch): the chunked window keeps fp32 copies of
      the rotated q, k, v and of each chunk's two key/value chunks, `5 D`; with
      `model.attention.impl=reference` also each chunk's scores and probabilities,
      `2 H 2c` per token: O(T w);
    - FreeSolo's readout (fs, fsl): it recomputes its chunked logits in the backward pass and
      keeps only its output, log-sum-exp and RMSNorm inputs, `4 D` (with the window: `9 D`);
  with `train.activation_checkpointing` each layer keeps only its input `D`, and the backward
  recomputes one layer at a time: one layer's activations are live at once (transient).
  Sequence parallelism divides the tokens by sp; the kinds that read the whole prefix (or FS-L's
  retained cells) also keep the gathered keys and values of the whole row and front-padded
  queries, `3 D b T` per layer.
- AR-GRC (no decoder layers): each token is one row of a cell call in the up-sweep and one in
  the down-sweep; a row keeps `17 D` (its `[a; b]`, the `4D` hidden layer before and after the
  GELU, the `4D` gates and candidate, the sigmoids and products, the LayerNorm), and the leaves
  and the readout `4 E + 2 D` per token (E = d_model, D = argrc.d_state); with activation
  checkpointing `4 E + 2 D`, and one level's cell calls recomputed at a time (transient
  `17 D t / 2`).
- the output head: the logits `[t, V]` in fp32, their log-softmax kept for the cross entropy and
  their gradient: `3 V` fp32 per token; with `train.loss_chunk = k` only `k` positions' worth
  exist at once (transient `3 V k`), plus the hidden states kept for the recomputation, `D`.

On a CPU all ranks of a host share its memory: the estimate is multiplied by the ranks on the
host. The guard compares it with the device's memory (a GPU's total memory; on a CPU the host's
available memory, /proc/meminfo's MemAvailable) and refuses above `USABLE_FRACTION` of it.

Calibration (the quickstart model: 4 layers, d_model 128, 4 heads, V 260, window 128, cells 16,
blocks 64; fp32 on a CPU, one thread; b = 2): the measured peak is the largest sum of live
allocations over one step (forward, backward, AdamW step) from torch.profiler's memory events;
"RSS" is the growth of the process's peak resident memory over the same step, which glibc's
allocator inflates at these small tensor sizes (freed blocks are kept for reuse; tensors above
32 MB, those of long rows, are mapped and returned, so at long lengths RSS follows the live peak).

    kind   T     ckpt   estimate  live peak  est/live  RSS growth
    tfpp   1024  off    104 MB     98 MB     1.06      148 MB
    tfpp   4096  off    374 MB    390 MB     0.96      513 MB
    tfpp   1024  on      45 MB     33 MB     1.35      102 MB
    tfpp   4096  on     138 MB    130 MB     1.07      395 MB
    fs     1024  off    140 MB    134 MB     1.04      186 MB
    fs     4096  off    518 MB    538 MB     0.96      652 MB
    fs     1024  on      54 MB     42 MB     1.28      109 MB
    fs     4096  on     174 MB    167 MB     1.05      395 MB
    fsl    1024  off    140 MB    134 MB     1.04      169 MB
    fsl    4096  off    518 MB    538 MB     0.96      592 MB
    fsl    1024  on      54 MB     42 MB     1.28      131 MB
    fsl    4096  on     174 MB    167 MB     1.05      394 MB
    swa    1024  off    124 MB    113 MB     1.10
    swa    4096  off    454 MB    453 MB     1.00
    swa    1024  on      50 MB     37 MB     1.35
    swa    4096  on     158 MB    145 MB     1.09
    argrc  1024  off     54 MB     50 MB     1.08       70 MB
    argrc  4096  off    192 MB    199 MB     0.97      232 MB
    argrc  1024  on      28 MB     17 MB     1.63       58 MB
    argrc  4096  on      90 MB     66 MB     1.35      163 MB
    tfpp   4096  off, train.loss_chunk=1024: 357 MB estimated, 382 MB live (0.93)

So the estimate is within 0.93x - 1.63x of the allocator's peak for every kind measured (the
checkpointed short rows, where fixed parts weigh most, are overestimated most; within 10% at
T = 4096 without checkpointing), and below the RSS growth at these short lengths by up to 3x,
where the allocator's retained blocks dominate; the guard's 10% margin covers the process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from fsframework.config import Config
from fsframework.config.checks import ConfigError
from fsframework.config.kinds import is_freesolo, kind_facts
from fsframework.models.registry import build_model

GB = 1e9
# the share of the device's memory a step may take: the rest is the process itself (the
# interpreter, torch, the data loader's buffers) and the allocator's slack
USABLE_FRACTION = 0.9
FP32 = 4
ADAM_MOMENTS = 8  # AdamW's exp_avg and exp_avg_sq, fp32
BF16_MASTER = 8  # under bf16: the fp32 master weights and the fp32 gradient accumulation

# saved elements per decoder layer and token, in units of D (the attention kinds' extras)
BLOCK_D, BLOCK_F = 12, 3
WINDOW_EXTRA_D = 5
READOUT_EXTRA_D = 4
PREFIX_GATHER_D = 3  # sequence parallelism: the gathered keys, values and padded queries
WINDOW_CHUNK = {"reference": 256}  # queries per chunk of the PyTorch window paths
FUSED_WINDOW_CHUNK = 128
ALIBI_CHUNK = 512
REWIRED_TILE = 128
ARGRC_ROW_D = 17  # one cell call's row
HEAD_V = 3  # logits, their log-softmax, their gradient (fp32)


@dataclass
class MemoryEstimate:
    """The parts of one rank's training-step peak, in bytes, and the ranks sharing the device."""

    weights: float
    gradients: float
    optimizer: float
    activations: float  # kept for the backward pass over the whole forward
    transient: float  # live at once besides: one recomputed layer, a logits chunk, a score tile
    ranks_per_device: int = 1

    @property
    def per_rank(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient

    @property
    def total(self) -> float:
        return self.per_rank * self.ranks_per_device

    def parts(self) -> str:
        ranks = f" x {self.ranks_per_device} ranks on this host" if self.ranks_per_device > 1 else ""
        return (f"weights {self.weights / GB:.2f} + gradients {self.gradients / GB:.2f} + optimizer "
                f"{self.optimizer / GB:.2f} + activations {self.activations / GB:.2f} + transient "
                f"{self.transient / GB:.2f} GB{ranks}")


def parameter_count(cfg: Config) -> int:
    """The model's parameters, counted on a model built on the meta device (no memory, exact)."""
    with torch.device("meta"):
        model = build_model(cfg.model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _activation_bytes(cfg: Config, bf16: bool) -> tuple[float, float]:
    """(saved activations, transient) of one rank's micro-batch, in bytes."""
    m, t_cfg = cfg.model, cfg.train
    act = 2 if bf16 else FP32
    b, seq, sp = cfg.data.micro_batch_size, cfg.data.seq_len, cfg.parallel.sp
    tokens = b * seq / sp
    ckpt = t_cfg.activation_checkpointing
    D = m.d_model
    chunk = t_cfg.loss_chunk
    if chunk and chunk < tokens:
        head_saved, head_transient = tokens * D * act, HEAD_V * m.vocab_size * chunk * FP32
    else:
        head_saved, head_transient = HEAD_V * m.vocab_size * tokens * FP32, 0.0
    facts = kind_facts(m.name)
    if not facts.decoder_blocks:  # AR-GRC: the leaves, the scan's cell calls, the readout
        state = m.argrc.d_state or D
        outer = (4 * D + 2 * state + 2 * m.argrc.post_embed_mlp_hidden) * act
        row = (ARGRC_ROW_D * state + 2 * m.argrc.post_merge_mlp_hidden) * act
        if ckpt:
            return tokens * outer + head_saved, max(row * tokens / 2, head_transient)
        return tokens * (outer + 2 * row) + head_saved, head_transient
    a = m.attention
    per_token = BLOCK_D * D + BLOCK_F * m.ffn_hidden  # elements of one layer
    per_layer_fixed = 0.0  # elements of one layer not proportional to the tokens
    transient = 0.0
    if facts.attention_memory == "window":
        per_token += WINDOW_EXTRA_D * D
        if a.impl == "reference":
            c = max(WINDOW_CHUNK["reference"], a.window)
            per_token += 2 * m.n_heads * 2 * c
    if is_freesolo(m.name):
        per_token += READOUT_EXTRA_D * D
    if facts.attention_memory == "bias":  # the explicit bias masks, one per chunk, shared by the rows
        per_layer_fixed += m.n_heads * (seq / sp) * seq / 2
    if facts.attention_memory == "tile":
        transient += 3 * b * m.n_heads * REWIRED_TILE * seq * FP32
    if sp > 1 and facts.keys in ("prefix", "retained"):
        per_layer_fixed += PREFIX_GATHER_D * D * b * seq
    layer = (per_token * tokens + per_layer_fixed) * act
    if ckpt:
        saved = m.n_layers * tokens * D * act
        transient += layer  # the one layer recomputed in the backward pass
    else:
        saved = m.n_layers * layer
    return saved + head_saved, max(transient, head_transient)


def estimate(cfg: Config, *, world_size: int = 1, ranks_per_device: int = 1, bf16: bool = False,
             parameters: Optional[int] = None) -> MemoryEstimate:
    """One rank's peak memory of a training step of `cfg` (the module docstring's formula).
    world_size: all ranks (data-parallel ranks are world_size / sp); ranks_per_device: the ranks
    that share the device's memory (a CPU host's ranks); parameters: the count, when known."""
    n = parameter_count(cfg) if parameters is None else parameters
    dp = max(1, world_size // cfg.parallel.sp)
    stage = cfg.parallel.zero_stage
    width = 2 if bf16 else FP32
    weights = n * width / (dp if stage >= 3 else 1)
    gradients = n * width / (dp if stage >= 2 else 1)
    optimizer = n * (ADAM_MOMENTS + (BF16_MASTER if bf16 else 0)) / (dp if stage >= 1 else 1)
    activations, transient = _activation_bytes(cfg, bf16)
    return MemoryEstimate(weights, gradients, optimizer, activations, transient, ranks_per_device)


def host_available_bytes() -> Optional[float]:
    """The host's available memory (MemAvailable of /proc/meminfo; psutil where that is missing),
    None when neither says."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return float(psutil.virtual_memory().available)


def device_memory(cuda: bool, local_rank: int = 0) -> tuple[Optional[float], str]:
    """(bytes, what they are) of the memory a step runs in: a GPU's total, or the host's available."""
    if cuda:
        import torch

        return float(torch.cuda.get_device_properties(local_rank).total_memory), "GPU memory"
    return host_available_bytes(), "available host memory"


def _granule(cfg: Config) -> int:
    """Row lengths the suggestion steps by: whole query blocks for FreeSolo, split evenly over sp."""
    step = cfg.model.attention.block_size if is_freesolo(cfg.model.name) else 64
    return step * cfg.parallel.sp


def largest_fitting(cfg: Config, limit: float, total: Callable[[Config], float], key: str) -> int:
    """The largest value of `key` ("seq_len" or "micro_batch_size" under data) whose estimate
    `total` fits `limit`, 0 when none does; the estimate grows with either."""
    from dataclasses import replace

    granule = _granule(cfg) if key == "seq_len" else 1

    def fits(units: int) -> bool:
        return total(replace(cfg, data=replace(cfg.data, **{key: units * granule}))) <= limit

    high = getattr(cfg.data, key) // granule
    if high < 1 or not fits(1):
        return 0
    low = 1  # fits; high does not (the caller's value was refused)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low * granule


def check_memory(cfg: Config, *, cuda: bool, world_size: int = 1, ranks_per_device: int = 1, bf16: bool = False,
                 log: Callable[[str], None] = print) -> MemoryEstimate:
    """Estimate a step's peak, say it in one line, and raise ConfigError (one line: the estimate,
    the memory, the largest `data.seq_len` and `data.micro_batch_size` that fit, the overrides)
    when it exceeds `USABLE_FRACTION` of the device's memory (`train.memory_limit_gb` when set).
    `train.memory_check=false` says the line and never refuses."""
    n = parameter_count(cfg)

    def total(c: Config) -> float:
        return estimate(c, world_size=world_size, ranks_per_device=ranks_per_device, bf16=bf16, parameters=n).total

    found = estimate(cfg, world_size=world_size, ranks_per_device=ranks_per_device, bf16=bf16, parameters=n)
    if cfg.train.memory_limit_gb > 0:
        memory, what = cfg.train.memory_limit_gb * GB, "train.memory_limit_gb"
    else:
        memory, what = device_memory(cuda, int(os.environ.get("LOCAL_RANK", "0")))
    if memory is None:
        log(f"memory: about {found.total / GB:.1f} GB a step ({found.parts()}); the device's memory is unknown")
        return found
    log(f"memory: about {found.total / GB:.1f} GB a step of {memory / GB:.1f} GB {what} ({found.parts()})")
    limit = USABLE_FRACTION * memory
    if found.total <= limit or not cfg.train.memory_check:
        return found
    d = cfg.data
    length = largest_fitting(cfg, limit, total, "seq_len")
    rows = largest_fitting(cfg, limit, total, "micro_batch_size")
    fits = [f"data.seq_len={length}" if length else "", f"data.micro_batch_size={rows}" if rows else ""]
    fit = " or ".join(x for x in fits if x) or "no data.seq_len or data.micro_batch_size (fewer weights or ranks)"
    hints = [] if cfg.train.activation_checkpointing else ["train.activation_checkpointing=true"]
    if not cfg.train.loss_chunk:
        hints.append("train.loss_chunk=4096")
    save = f", or save memory with {' and '.join(hints)}" if hints else ""
    raise ConfigError(
        f"a training step needs about {found.total / GB:.1f} GB ({found.parts()}) at data.seq_len={d.seq_len}, "
        f"data.micro_batch_size={d.micro_batch_size}, more than {USABLE_FRACTION:.0%} of the {memory / GB:.1f} GB "
        f"{what}: the largest that fits is {fit}{save}; train.memory_check=false runs it anyway")
