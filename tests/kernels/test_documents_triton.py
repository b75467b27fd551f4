"""Document masking through the Triton kernels (the interpreter on CPU): a packed row's documents read
apart give, through every kernel path, the logits and gradients of each document run alone
(docs/training.md, "Documents"); each kernel reads every document of the row in one launch."""

from __future__ import annotations

import pytest
import torch

from fsframework.config import AttentionConfig, ModelConfig
from fsframework.models.registry import build_model

VOCAB = 64
SIZES = [13, 27, 8]  # not multiples of the cells (4) or blocks (8); the longest crosses the window (16)


def _model(name: str):
    att = AttentionConfig(window=16, cell_size=4, block_size=8, top_k=2, recent_cells=2, retained_cells=3,
                          impl="triton")
    torch.manual_seed(0)
    return build_model(ModelConfig(name=name, vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2, attention=att))


@pytest.mark.parametrize("name", ["fs", "fsl", "swa", "rewired", "argrc", "tfpp", "alibi", "sinusoidal"])
def test_packed_documents_through_the_kernels(name, device):
    """On a GPU (tools/gpu_check.sh) the compiled kernels, doc_ids on the host as the trainer keeps them; the
    dense kinds there through FlexAttention with the batch's document BlockMask (on the CPU: their chunks)."""
    model = _model(name).to(device)
    tokens = torch.randint(0, VOCAB, (1, sum(SIZES)), generator=torch.Generator().manual_seed(1)).to(device)
    doc_ids = torch.tensor([[d for d, size in enumerate(SIZES) for _ in range(size)]])
    starts = [sum(SIZES[:i]) for i in range(len(SIZES))]
    probe = (torch.randn(1, sum(SIZES), VOCAB) / sum(SIZES) ** 0.5).to(device)

    def run(packed: bool):
        model.zero_grad()
        if packed:
            logits = model(tokens, doc_ids=doc_ids)
        else:
            logits = torch.cat([model(tokens[:, s:s + n]) for s, n in zip(starts, SIZES)], dim=1)
        (logits * probe).sum().backward()
        return logits.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    (packed, packed_grads), (alone, alone_grads) = run(True), run(False)
    # compiled fp32 products run in tf32 on a GPU, tiled differently packed and alone
    atol = 1e-5 if device == "cpu" else 2e-3
    torch.testing.assert_close(packed, alone, rtol=0, atol=atol)
    assert packed_grads.keys() == alone_grads.keys() and packed_grads
    for key in packed_grads:
        torch.testing.assert_close(packed_grads[key], alone_grads[key], rtol=0, atol=atol, msg=key)
