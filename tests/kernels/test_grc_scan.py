"""The Triton GRC tree scan against the reference (fsframework.ops.scan with the model's
GRCCell): one cell, then the whole tree, forward and every gradient, fp32 and bf16, odd N,
D not a power of two."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import assert_close

from fsf_kernels.grc_scan import grc_cell_bwd, grc_cell_fwd, grc_exclusive_scan
from fsf_kernels.grc_scan.cell import cell_params
from fsframework.models.argrc import GRCCell
from fsframework.ops.scan import exclusive_scan
from fsframework.models.losses import lm_losses

D = 12  # not a power of two: every row kernel masks its tail


def _cell(device, post_merge: int = 0) -> GRCCell:
    torch.manual_seed(0)
    cell = GRCCell(D, post_merge, 1e-6).to(device)
    with torch.no_grad():  # visible biases and LayerNorm affine, so their gradients matter
        for p in cell.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return cell


@pytest.mark.parametrize("dtype, post_merge", [(torch.float32, 0), (torch.bfloat16, 0), (torch.float32, 20)])
def test_one_cell_forward_and_backward(dtype, post_merge, device):
    cell = _cell(device, post_merge)
    a, b, dm = (torch.randn(7, D, device=device) for _ in range(3))
    ref_a, ref_b = a.clone().requires_grad_(), b.clone().requires_grad_()
    want = cell(ref_a, ref_b)
    want.backward(dm)
    params = cell_params(cell, dtype)
    got = grc_cell_fwd(a.to(dtype), b.to(dtype), params, 1e-6)
    assert_close(got, want, dtype, "op(a, b)")
    da, db, grads = grc_cell_bwd(a.to(dtype), b.to(dtype), dm.to(dtype), params, 1e-6)
    assert_close(da, ref_a.grad, dtype, "da")
    assert_close(db, ref_b.grad, dtype, "db")
    names = ["w1.weight", "w1.bias", "w2.weight", "w2.bias", "norm.weight", "norm.bias"]
    names += ["post.fc1.weight", "post.fc1.bias", "post.fc2.weight", "post.fc2.bias"] if post_merge else []
    assert len(grads) == len(names)
    for name, g in zip(names, grads):
        assert_close(g, cell.get_parameter(name).grad, dtype, name)


@pytest.mark.parametrize("dtype, n, per_sequence_identity, post_merge",
                         [(torch.float32, 11, False, 0), (torch.bfloat16, 6, True, 0), (torch.float32, 7, False, 20)])
def test_tree_scan_forward_and_every_gradient(dtype, n, per_sequence_identity, post_merge, device):
    cell = _cell(device, post_merge)
    torch.manual_seed(1)
    x = torch.randn(2, n, D, device=device)
    identity = torch.randn(2, D, device=device) if per_sequence_identity else torch.randn(D, device=device)
    grad = torch.randn(2, n, D, device=device)

    _compare_scans(exclusive_scan, grc_exclusive_scan, cell, x, identity, grad, dtype)


def _compare_scans(reference_scan, kernel_scan, cell, x, identity, grad, dtype) -> None:
    """`kernel_scan(x, cell, identity)` in `dtype` against `reference_scan` in fp32: the prefixes and
    the gradients of x, the identity and every cell parameter."""
    def run(scan, cast):
        cell.zero_grad()
        xs, e = x.clone().requires_grad_(), identity.clone().requires_grad_()
        out = scan(xs.to(cast), cell, e.to(cast))
        out.backward(grad.to(cast))
        return out.float(), xs.grad, e.grad, {k: p.grad.clone() for k, p in cell.named_parameters()}

    want = run(reference_scan, torch.float32)
    got = run(kernel_scan, dtype)
    assert_close(got[0], want[0], dtype, "prefixes")
    assert_close(got[1], want[1], dtype, "dx")
    assert_close(got[2], want[2], dtype, "d identity")
    for name in want[3]:
        assert_close(got[3][name], want[3][name], dtype, name)


def test_the_model_runs_the_kernel_under_impl_triton(device):
    from fsframework.config import ArgrcConfig, AttentionConfig, ModelConfig
    from fsframework.models import build_model

    def model(impl, **argrc):
        torch.manual_seed(0)
        return build_model(ModelConfig(name="argrc", vocab_size=40, d_model=16, argrc=ArgrcConfig(d_state=D, **argrc),
                                       attention=AttentionConfig(impl=impl))).to(device)

    tokens = torch.randint(0, 40, (2, 9), device=device)
    fused, reference = model("triton"), model("reference")
    lm_losses(fused(tokens), tokens)[0].backward()
    lm_losses(reference(tokens), tokens)[0].backward()
    assert_close(fused(tokens), reference(tokens), torch.float32, "logits")
    assert_close(fused.in_proj.weight.grad, reference.in_proj.weight.grad, torch.float32, "in_proj gradient")
    with pytest.raises(ValueError, match="GRC cell only"):
        model("triton", cell="mlp")(tokens)


@pytest.mark.parametrize("dtype, post_merge", [(torch.float32, 0), (torch.bfloat16, 0), (torch.float32, 20)])
def test_packed_tree_scan_forward_and_every_gradient(dtype, post_merge, device):
    """The packed tree (one launch per level for every sequence, `grc_packed_exclusive_scan`) against
    the reference's packed scan: sequences of 1, 2, odd and power-of-two lengths, one longer than
    the others' trees."""
    from fsf_kernels.common.tree_tables import tree_tables
    from fsf_kernels.grc_scan import grc_packed_exclusive_scan
    from fsframework.ops.scan import packed_exclusive_scan

    cell = _cell(device, post_merge)
    lengths = [1, 9, 2, 16, 5, 1]
    tables = tree_tables(lengths).to(device)
    torch.manual_seed(2)
    x = torch.randn(sum(lengths), D, device=device)
    identity = torch.randn(D, device=device)
    grad = torch.randn(sum(lengths), D, device=device)

    _compare_scans(lambda xs, c, e: packed_exclusive_scan(xs, tables, c, e),
                   lambda xs, c, e: grc_packed_exclusive_scan(xs, tables, c, e), cell, x, identity, grad, dtype)
