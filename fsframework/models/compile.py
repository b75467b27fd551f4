"""`train.compile` (docs/training.md): each decoder block run through `torch.compile`.

Regional compilation, as torchtitan does it: every block of a Transformer-family model is
compiled on its own (`nn.Module.compile`, in place, so parameter names and checkpoints stay
as they are), and the blocks share one compiled graph because they run the same code on
parameters of the same shapes. What a block's graph fuses is the host's work at small
batches: the norms, the gated MLP and the residual adds are tens of small ops per block in
eager mode. The attention call stays eager (`torch.compiler.disable`): it runs its own fused
work already (SDPA, the window, routing and readout kernels, the rewired kernel), and its
kernels' launchers and autograd functions are host code that tracing would break into
pieces or refuse.

Left out, with a clear error in the configuration: AR-GRC (no blocks: its scan applies one
cell at every tree level, at shapes that change per level), sequence parallelism (untested
with compiled blocks) and ZeRO-3 (it gathers each module's parameters in hooks that run
inside the block).
"""

from __future__ import annotations

import torch
from torch import nn

from fsframework.models.language_model import LanguageModel


def compile_blocks(model: nn.Module) -> nn.Module:
    """Compile every decoder block of `model` in place (`torch.compile`, default mode); returns `model`."""
    blocks = model.decoder_blocks() if isinstance(model, LanguageModel) else []
    if not blocks:
        raise TypeError(f"{type(model).__name__} has no decoder blocks to compile (train.compile)")
    for block in blocks:
        block.attn.forward = torch.compiler.disable(block.attn.forward)
        block.compile()
    return model


def compiled_blocks(model: LanguageModel) -> int:
    """How many of `model`'s decoder blocks run compiled."""
    # nn.Module.compile keeps the compiled call in `_compiled_call_impl` (None until then)
    return sum(block._compiled_call_impl is not None for block in model.decoder_blocks())
