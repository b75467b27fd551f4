"""FreeSolo attention layer (docs/freesolo.md §1.1-§1.6): a local RoPE window branch and a routed long-range
branch on ONE set of q/k/v projections.

Legend: B batch, T time, D model width, H heads, Dh head width.

    q, k, v = x W_q, x W_k, x W_v                        (unrotated, [B, T, H, Dh])
    local   = sliding-window attention, RoPE inside       (docs/freesolo.md §1.2)
    LR      = cell_readout(q, k, v, route(q, k)), FS, FS-L or FS-B  (docs/freesolo.md §1.3-§1.8, NoPE, per-head
              RMSNorm gain; FS-B reads FS/FS-L weights through its forests, with per-head thresholds tau)
    combine (after the readout RMSNorm, our choice, docs/freesolo.md §1.1):
      sum          o = W_o(local + LR)
      gate         o = W_o(local + sigmoid(x W_g + b_g)_h * LR),  b_g = 0 at init
      separate_wo  o = W_o(local) + W_o_lr(LR)
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from fsframework.config import COMBINE_MODES, ModelConfig
from fsframework.config.kinds import kind_facts
from fsframework.models.attention import QKVAttention
from fsframework.models.context import WHOLE_SEQUENCE, KeySource
from fsframework.models.documents import Documents
from fsframework.ops.freesolo import select_cells
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior
from fsframework.ops.freesolo_decode import FreeSoloDecodeState
from fsframework.ops.freesolo_documents import DocumentBlocks, packed_long_range
from fsframework.ops.freesolo_driver import Router, freesolo, new_decode_state
from fsframework.ops.local_attention import sliding_window_attention


class FreeSoloAttention(QKVAttention):
    """FS (routing variant "fs", full-prefix routing), FS-L (`"fsl"`, pruned by key norm) or FS-B
    (`"fsb"`, inference only: forest search, reading `fsb.top_k` cells; same parameters as FS, so
    FS and FS-L checkpoints load into it).

    Parameters: `wq, wk, wv, wo` (D x D, no bias), the readout RMSNorm gain `[H, Dh]`, one per
    layer and head, init `model.attention.readout_gain`: `lr_norm_log_gain` (log g, the
    default `readout_gain_param=log`) or `lr_norm_weight` (g, `linear`), read through
    `readout_gain()`; `w_gate` (D -> H, with bias) for
    combine="gate"; `wo_lr` (D x D) for combine="separate_wo". Buffers `sigma`, `lam`
    `[H]` (erf prior width and weight, persistent, never trained). FS-B: buffer `tau` `[H]`
    (Ftau's key-norm threshold, not saved: set from the checkpoint's calibration file by
    `set_fsb_thresholds`; `tau_source` names that file, None until set).
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int, key_span: Optional[int] = None):
        a = cfg.attention
        # the kind's facts name the routing variant (fsframework.config.kinds)
        self.routing = kind_facts(cfg.name).routing
        if not self.routing:
            raise ValueError(f"FreeSoloAttention needs a FreeSolo kind (its registry entry names a routing "
                             f"variant), got model.name={cfg.name!r}")
        if a.combine not in COMBINE_MODES:
            raise ValueError(f"model.attention.combine={a.combine!r} is not one of {COMBINE_MODES}")
        super().__init__(cfg, layer_idx, key_span)  # wq, wk, wv, wo
        # the settings the FreeSolo ops read, built once and passed whole (to the ops, SP and the caches)
        self.settings = FreeSoloConfig.from_attention(a, self.routing)
        # the readout gain g, learned as g itself or as log g (docs/freesolo.md §1.6); the two
        # forms have different names, so weights of one never load silently into the other
        if a.readout_gain_param == "log":
            self.lr_norm_log_gain = nn.Parameter(torch.zeros(cfg.n_heads, cfg.head_dim))
        else:
            self.lr_norm_weight = nn.Parameter(torch.ones(cfg.n_heads, cfg.head_dim))
        # routing-only scalars: buffers, so they are saved with the model but receive no gradient.
        # They are settings, never learned: the config is their truth, so loading weights sets
        # them back from it (`model.attention.lam=4` on a saved run reads with that prior).
        self.register_buffer("sigma", torch.full((cfg.n_heads,), float(a.sigma)))
        self.register_buffer("lam", torch.full((cfg.n_heads,), float(a.lam)))
        self.register_load_state_dict_post_hook(_prior_from_config)
        # FS-B thresholds live beside the checkpoint (calibration.json), not in its weights
        self.register_buffer("tau", torch.full((cfg.n_heads,), float("nan")), persistent=False)
        self.tau_source: Optional[str] = None
        # replaces the op's routing (`select_cells`) in whole-sequence forward passes, for diagnostics
        # and ablations (experiments/routing.py); None: the op's own
        self.router: Optional[Router] = None
        if a.combine == "gate":
            self.w_gate = nn.Linear(cfg.d_model, cfg.n_heads, bias=True)
        elif a.combine == "separate_wo":
            self.wo_lr = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.reset_extra_parameters()

    @torch.no_grad()
    def set_prior_from_config(self) -> None:
        """sigma and lam from the config, per head (docs/freesolo.md §1.4)."""
        self.sigma.fill_(float(self.cfg.attention.sigma))
        self.lam.fill_(float(self.cfg.attention.lam))

    @torch.no_grad()
    def reset_extra_parameters(self) -> None:
        """Re-initialise what the model-wide normal init must not touch or scales differently."""
        a = self.cfg.attention
        if a.readout_gain_param == "log":
            self.lr_norm_log_gain.fill_(math.log(a.readout_gain))
        else:
            self.lr_norm_weight.fill_(float(a.readout_gain))
        self.set_prior_from_config()
        if a.combine == "gate":
            nn.init.zeros_(self.w_gate.bias)  # sigmoid(0) = 1/2: both branches contribute from step 0
        elif a.combine == "separate_wo":
            # a residual-branch output projection, scaled down with depth like `wo`
            nn.init.normal_(self.wo_lr.weight, std=self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers))

    def readout_gain(self) -> torch.Tensor:
        """The long-range readout's RMSNorm gain g `[H, Dh]`, whichever form is learned."""
        if self.cfg.attention.readout_gain_param == "log":
            return self.lr_norm_log_gain.exp()
        return self.lr_norm_weight

    @property
    def prior(self) -> RoutingPrior:
        """The routing prior as data: the buffers sigma, lam `[H]` and FS-B's thresholds tau `[H]`
        (None but for FS-B; ValueError when FS-B's were never set, `fsb_tau`)."""
        return RoutingPrior(sigma=self.sigma, lam=self.lam, tau=self.fsb_tau() if self.routing == "fsb" else None)

    def route(self, q: torch.Tensor, k: torch.Tensor, q_start: int = 0) -> torch.Tensor:
        """Unrotated q of positions `[q_start, q_start + n)` and k of `[0, q_start + n)`
        `[B, *, H, Dh]` -> the selected cells `[B, n, H, K]` (no gradient; FS-B: `fsb.top_k` cells,
        docs/freesolo.md §1.8). For diagnostics (experiments/routing.py): the forward pass routes inside
        the FreeSolo op (`fsframework.ops.freesolo_driver.freesolo`), with the same call."""
        return (self.router or select_cells)(q, k, self.settings, self.prior, q_start=q_start)

    @property
    def routes_from_summaries(self) -> bool:
        """FS's and FS-L's routing read only the cells' summaries (FS-L's pruning reads `a_c`, a summary);
        FS-B's rescoring and routing by the token keys (`model.attention.route_score=tokens`) read more."""
        return self.routing in ("fs", "fsl") and self.settings.route_score == "mean"

    def fsb_tau(self) -> Optional[torch.Tensor]:
        """FS-B's per-head thresholds `[H]` (None for forests="f0"); ValueError when they were never set."""
        a = self.cfg.attention
        if a.fsb.forests == "f0":
            return None
        if self.tau_source is None:
            raise ValueError("FS-B needs per-head key-norm thresholds: run `fsf calibrate RUN` on the FS or FS-L "
                             "checkpoint (it writes calibration.json beside the weights), or read with "
                             "model.attention.fsb.forests=f0")
        return self.tau

    def branches(self, x: torch.Tensor, source: KeySource = WHOLE_SEQUENCE) -> tuple[torch.Tensor, torch.Tensor]:
        """x `[B, n, D]` -> (local, LR), each `[B, n, H, Dh]`, before the combination."""
        q, k, v = self.project(x, source.start)
        # the source says what the queries read besides their own keys: the whole sequence, a
        # sequence-parallel rank's gathered keys and routed cells, or a decode cache's carried state
        k, v, state = source.freesolo_state(self.layer_idx, q, k, v, self.key_span, self)
        local, long_range, _ = freesolo(q, k, v, state, self.settings, self.prior, self.readout_gain())
        return local, long_range

    def forward_run(self, x: torch.Tensor, source: KeySource = WHOLE_SEQUENCE) -> torch.Tensor:
        return self.combine(x, *self.branches(x, source))

    @property
    def reads_packed_rows(self) -> bool:
        """FS, FS-L and FS-B read packed rows in one call (`forward_packed_rows`); a diagnostic `router`
        reads each document length apart (`Documents.map`)."""
        return self.router is None

    def forward_packed_rows(self, x: torch.Tensor, documents: Documents) -> torch.Tensor:
        """x `[B, T, D]` of packed rows that each begin a document -> `[B, T, D]`, every document read as a
        row of its own: the window over the rows at the document positions, the long-range branch over
        the long documents laid out from block boundaries (`fsframework.ops.freesolo_documents`); one
        call of each op for the whole batch."""
        q, k, v = self.project(x)
        s = self.settings
        local = sliding_window_attention(q, k, v, window=s.window, rope_theta=s.rope_theta, impl=s.impl,
                                         positions=documents.positions)
        blocks = documents.derived(f"freesolo_blocks:{s.block_size}:{s.cell_size}", lambda: DocumentBlocks.of(
            documents.host_positions, s.block_size, s.cell_size, x.device))
        return self.combine(x, local, packed_long_range(q, k, v, blocks, s, self.prior, self.readout_gain()))

    def combine(self, x: torch.Tensor, local: torch.Tensor, long_range: torch.Tensor) -> torch.Tensor:
        """The two branches `[B, n, H, Dh]` of `x` `[B, n, D]` -> the layer's output `[B, n, D]`
        (`model.attention.combine`, module docstring)."""
        combine = self.cfg.attention.combine
        if combine == "separate_wo":
            return self.wo(local.flatten(2)) + self.wo_lr(long_range.flatten(2))
        if combine == "gate":
            long_range = torch.sigmoid(self.w_gate(x)).unsqueeze(-1).to(long_range.dtype) * long_range  # B T H 1
        return self.wo((local + long_range).flatten(2))


def freesolo_decode_state(module: FreeSoloAttention) -> FreeSoloDecodeState:
    """A FreeSolo layer's empty decode state (`fsframework.ops.freesolo_decode`): what the registry names as
    the FreeSolo kinds' layer cache, built from the layer's settings alone."""
    return new_decode_state(module.settings)


def freesolo_layers(model: nn.Module) -> list[FreeSoloAttention]:
    """The model's FreeSolo attention modules, in layer order."""
    return sorted((m for m in model.modules() if isinstance(m, FreeSoloAttention)), key=lambda m: m.layer_idx)


def set_fsb_thresholds(model: nn.Module, tau: list, source: str) -> None:
    """Set FS-B's per-head thresholds: `tau` n_layers lists of n_heads finite numbers, read from `source`.

    Raises ValueError naming `source` when the shape is not the model's (a calibration of
    another model size) or a value is not finite.
    """
    layers = freesolo_layers(model)
    if not layers:
        raise ValueError(f"{source}: the model has no FreeSolo layers to take FS-B thresholds")
    heads = layers[0].n_heads
    shape_ok = isinstance(tau, list) and len(tau) == len(layers) and all(
        isinstance(row, list) and len(row) == heads for row in tau)
    if not shape_ok:
        got = f"{len(tau)} layers x {sorted({len(r) if isinstance(r, list) else -1 for r in tau})} heads" \
            if isinstance(tau, list) else type(tau).__name__
        raise ValueError(f"{source}: tau must be {len(layers)} layers x {heads} heads (this model), got {got}: "
                         "a calibration of another model size? run `fsf calibrate` on this checkpoint")
    values = torch.tensor(tau, dtype=torch.float64)
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{source}: tau must be finite numbers, got {tau}")
    for layer, row in zip(layers, values):
        layer.tau.copy_(row.to(layer.tau.dtype))
        layer.tau_source = source


def _prior_from_config(module: "FreeSoloAttention", incompatible_keys) -> None:
    """After a state dict loads, the routing prior's settings are the config's again."""
    module.set_prior_from_config()
