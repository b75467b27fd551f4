"""AR-GRC's settings (`model.argrc.*`; model.name=argrc, docs/argrc.md)."""

from __future__ import annotations

from dataclasses import dataclass

from fsframework.config.checks import choice, positive_fields

ARGRC_CELLS = ("grc", "mlp")
ARGRC_IDENTITIES = ("learned", "zeros")


@dataclass
class ArgrcConfig:
    """AR-GRC, the log-depth recurrent LM: `model.d_model` is the embedding width E, `d_state`
    the scan width D."""

    d_state: int = 0  # D; 0: model.d_model
    post_embed_mlp_hidden: int = 0  # residual position-wise MLP after Linear(E -> D); 0: none
    post_merge_mlp_hidden: int = 0  # residual MLP after each composition; 0: none
    cell: str = "grc"  # grc (gated recursive cell) | mlp (the MLP-operator ablation)
    identity: str = "learned"  # the root value of the down-sweep: learned | zeros


def check_argrc(g: ArgrcConfig) -> None:
    choice("model.argrc.cell", g.cell, ARGRC_CELLS)
    choice("model.argrc.identity", g.identity, ARGRC_IDENTITIES)
    positive_fields("model.argrc", g, ("d_state", "post_embed_mlp_hidden", "post_merge_mlp_hidden"), zero_ok=True)
