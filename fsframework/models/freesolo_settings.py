"""FreeSolo settings at the schema's defaults (`fsframework.config.AttentionConfig`) with the fields a caller
sets, as the ops take them (`fsframework.ops.freesolo_config`): for tests, benchmarks and scripts that call
the ops without a model config (a layer builds its own, `FreeSoloConfig.from_attention`)."""

from __future__ import annotations

import torch

from fsframework.config import AttentionConfig
from fsframework.ops.freesolo_config import FreeSoloConfig, RoutingPrior

_DEFAULTS = AttentionConfig()


def fs_config(variant: str = "fs", **changes) -> FreeSoloConfig:
    """The settings of a layer with routing `variant` and the schema's defaults, with `changes`."""
    return FreeSoloConfig.from_attention(_DEFAULTS, variant).replace(**changes)


def fs_prior(sigma: float | torch.Tensor = _DEFAULTS.sigma, lam: float | torch.Tensor = _DEFAULTS.lam,
             tau: torch.Tensor | None = None) -> RoutingPrior:
    """A routing prior; sigma and lam (floats or `[H]` tensors) default to the schema's."""
    return RoutingPrior(sigma=sigma, lam=lam, tau=tau)


def fs_pair(**fields) -> tuple[FreeSoloConfig, RoutingPrior]:
    """(config, prior) from one set of fields: sigma, lam and tau go to the prior, the rest to the
    settings (`fs_config`), so a caller can keep one dict of both for several ops."""
    prior = {name: fields.pop(name) for name in ("sigma", "lam", "tau") if name in fields}
    return fs_config(**fields), fs_prior(**prior)
