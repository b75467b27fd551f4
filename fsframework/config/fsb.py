"""FS-B's read settings (`model.attention.fsb.*`; model.name=fsb, inference only; docs/freesolo.md §1.8)."""

from __future__ import annotations

from dataclasses import dataclass

from fsframework.config.checks import ConfigError, choice, positive

FSB_FORESTS = ("both", "f0", "ftau")  # both forests, or F0 / Ftau alone


@dataclass
class FsbConfig:
    """How FS-B searches FS/FS-L weights: per query, `top_k` cells out of a beam over two forests."""

    top_k: int = 4  # K cells read per query, whatever model.attention.top_k the checkpoint trained with
    beam_width: int = 16  # Wb, per forest; >= top_k
    bound_c: float = 8.0  # c of the node bound U_v
    forests: str = "both"  # both | f0 | ftau (single-forest ablations)
    calibration: str = ""  # per-head tau file; "" = calibration.json of the checkpoint read


def check_fsb(f: FsbConfig) -> None:
    """Checked whatever the model, so a typo fails before an FS-B evaluation is asked for."""
    choice("model.attention.fsb.forests", f.forests, FSB_FORESTS)
    positive("model.attention.fsb.top_k", f.top_k)
    positive("model.attention.fsb.bound_c", f.bound_c, zero_ok=True)
    if f.beam_width < f.top_k:
        raise ConfigError(f"model.attention.fsb.beam_width={f.beam_width} must be >= "
                          f"model.attention.fsb.top_k={f.top_k}")
