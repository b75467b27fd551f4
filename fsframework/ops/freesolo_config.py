"""A FreeSolo layer's settings and routing prior, each one value passed whole to the ops (docs/freesolo.md §1.3-§1.8).

`FreeSoloConfig` holds every setting the FreeSolo ops read (routing, readout, the local window,
FS-B's search), `RoutingPrior` the per-head constants of Eq. 7's prior (sigma, lam) and FS-B's
calibrated key-norm thresholds (tau). A layer builds its config once, from its attention config
(`FreeSoloConfig.from_attention`), and hands both to the ops, sequence parallelism and the decode
caches, which read nothing else of the layer.

Neither declares a default: the user-facing schema (`fsframework.config.attention`, `fsframework.config.fsb`)
is the one place the defaults live. The ops stay importable with torch alone, so `from_attention` reads
the attention config's fields by name rather than importing its class.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fsf_kernels.common.args import prior_per_head


@dataclass(frozen=True)
class FreeSoloConfig:
    """What the FreeSolo ops read of a layer's settings (the meaning of each: `fsframework.config.attention`)."""

    variant: str  # routing: "fs" (every eligible cell), "fsl" (recent + retained by key norm), "fsb" (forest search)
    window: int  # local branch: keys with 0 <= i - j <= window
    rope_theta: float | None  # the local branch's RoPE base (None: no rotation)
    cell_size: int  # s
    block_size: int  # B, a multiple of s: queries of one block share their available cells
    top_k: int  # K cells read per query (FS-B: model.attention.fsb.top_k)
    recent_cells: int  # W (FS-L)
    retained_cells: int  # P (FS-L)
    impl: str  # auto | reference | triton (`fsframework.ops.dispatch`)
    readout_backward: str  # "gain" (the true gradient) or "unit" (as if the read had gain 1)
    route_score: str  # routing's content term: "mean" (q . kbar, Eq. 7) or "tokens" (log-sum-exp of the token logits)
    beam_width: int  # FS-B: Wb per forest
    bound_c: float  # FS-B: c of the node bound U_v
    forests: str  # FS-B: both | f0 | ftau

    @classmethod
    def from_attention(cls, attention, variant: str) -> "FreeSoloConfig":
        """The settings of a layer with routing `variant` from its `model.attention` config (an
        `AttentionConfig`, or a structured omegaconf node of one)."""
        fsb = attention.fsb
        return cls(variant=variant, window=attention.window, rope_theta=attention.rope_theta,
                   cell_size=attention.cell_size, block_size=attention.block_size,
                   top_k=fsb.top_k if variant == "fsb" else attention.top_k, recent_cells=attention.recent_cells,
                   retained_cells=attention.retained_cells, impl=attention.impl,
                   readout_backward=attention.readout_backward, route_score=attention.route_score,
                   beam_width=fsb.beam_width, bound_c=fsb.bound_c,
                   forests=fsb.forests)

    def replace(self, **changes) -> "FreeSoloConfig":
        """A copy with `changes` (field name -> value)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class RoutingPrior:
    """Eq. 7's prior `lam_h * a_c * erf((i - p_c) / (2 sigma_h))` per head, and FS-B's thresholds.

    sigma (> 0) and lam (>= 0): floats or `[H]` tensors (a layer's buffers); tau: FS-B's per-head
    key-norm thresholds `[H]` (docs/freesolo.md §1.8), None where no forest `Ftau` is searched."""

    sigma: float | torch.Tensor
    lam: float | torch.Tensor
    tau: torch.Tensor | None = None

    def per_head(self, heads: int, *, like: torch.Tensor,
                 batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(sigma_h, lam_h) as `[H]` tensors in `like`'s dtype and device (`[batch * H]`, b-major, with `batch`)."""
        return prior_per_head(self.sigma, self.lam, heads, like=like, batch=batch)
