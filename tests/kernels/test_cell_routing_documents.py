"""Triton FS / FS-L cell selection over packed documents (`first_cells`) in one launch per kernel.

Documents are laid end to end in a row, each from a query-block boundary, with zero rows after it up
to the next boundary (`fsframework.ops.freesolo_documents`); `first_cells` names, per query block,
the first cell of the block's document. The kernel must select exactly what the reference selects
with `first_cells`, and what each document selects when it is routed alone (shifted by its first
cell): a block reads only its own document's cells, and FS-L's history restarts at each document.
"""

import pytest
import torch

from fsframework.models.freesolo_settings import fs_pair
from fsframework.ops.freesolo import select_cells as op_select_cells
from fsframework.ops.freesolo_routing import select_cells_reference
from fsf_kernels.cell_routing import select_cells
from kernel_testing import gpu, kernel_launches, laid_out_documents, on_interpreter, routing_scores

F32, BF16 = torch.float32, torch.bfloat16

# (document lengths, cell_size, block_size, top_k, retained P, recent W): lengths not multiples of the
# cell or the block, documents shorter than a block (nothing long range: all -1), a document of whole
# blocks; with s = 2 a long document's prefix spans two 64-cell tiles, its loop starting mid-tile
LAYOUTS = [
    ([37, 9, 50, 23], 4, 16, 3, 3, 2),
    ([20, 5, 120], 2, 16, 4, 5, 3),  # the last document's cells (24..83) cross a 64-cell tile, from mid-tile
    ([13, 48, 3, 29, 21], 4, 8, 2, 0, 2),  # FS-L without retained cells
    ([27, 1, 44, 19], 4, 8, 3, 4, 0),  # FS-L without recent cells
]


def _id(layout):
    lengths, s, blk, k, p, w = layout
    return f"docs{'-'.join(map(str, lengths))}-s{s}-blk{blk}-K{k}-P{p}-W{w}"


def _documents(lengths, gen, *, batch=2, heads=2, dim=16):
    """Per-document (q, k) `[batch, L, heads, dim]`, fp32 on the CPU."""
    return [tuple(torch.randn(batch, n, heads, dim, generator=gen) for _ in range(2)) for n in lengths]


def _kwargs(variant, layout):
    _, s, blk, top_k, p, w = layout
    return dict(variant=variant, cell_size=s, block_size=blk, top_k=top_k, retained_cells=p, recent_cells=w,
                sigma=torch.tensor([1.5, 6.0]), lam=0.8)


def _assert_matches(got, want, q, k, kwargs, exact):
    """The same cells; off the interpreter (tf32 products for half inputs, another summation order),
    picks may differ only where their fp64 scores tie within a tolerance."""
    if exact:
        assert torch.equal(got, want), f"{int((got != want).any(-1).sum())} rows differ"
        return
    assert ((got >= 0).sum(-1) == (want >= 0).sum(-1)).all(), "different numbers of selected cells"
    bad = (got != want).any(-1)
    if bad.any():
        sk = dict(cell_size=kwargs["cell_size"], block_size=kwargs["block_size"], sigma=kwargs["sigma"],
                  lam=kwargs["lam"])
        gap = (routing_scores(q, k, got.cpu(), **sk) - routing_scores(q, k, want.cpu(), **sk)).abs()
        gap = gap.nan_to_num(0.0).amax(-1)[bad.cpu()]
        assert gap.max() <= (1e-5 if q.dtype == F32 else 2e-2), f"worst score gap {gap.max():.3e}"


# every layout in fp32, the first in bf16 too (the interpreter's seconds go to each case)
CASES = [(layout, dtype) for layout in LAYOUTS for dtype in (F32, BF16) if dtype == F32 or layout is LAYOUTS[0]]


@gpu  # also in the GPU check: on a device this runs the compiled kernels
@pytest.mark.parametrize("layout, dtype", CASES, ids=[f"{_id(c)}-{'fp32' if d == F32 else 'bf16'}" for c, d in CASES])
@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_documents_match_the_reference_and_each_document_alone(variant, layout, dtype, device):
    gen = torch.Generator().manual_seed(sum(layout[0]) + layout[1])
    documents = _documents(layout[0], gen)
    q_row, k_row, first_cells, offsets = laid_out_documents(documents, layout[1], layout[2])
    kwargs = _kwargs(variant, layout)
    config, prior = fs_pair(**kwargs)
    prior_dev = fs_pair(**dict(kwargs, sigma=kwargs["sigma"].to(device)))[1]
    q_dev, k_dev = (x.to(device, dtype) for x in (q_row, k_row))

    got = select_cells(q_dev, k_dev, config, prior_dev, first_cells=first_cells)
    assert got.shape == (*q_row.shape[:3], layout[3]) and got.dtype == torch.long
    # the reference routes the same (rounded) inputs in fp32
    q_ref, k_ref = (x.to(dtype).float() for x in (q_row, k_row))
    want = select_cells_reference(q_ref, k_ref, config, prior, first_cells=first_cells)
    _assert_matches(got.cpu(), want, q_ref, k_ref, kwargs, exact=on_interpreter)
    # the op's impl="triton" path hands first_cells to this kernel
    via_op = op_select_cells(q_dev, k_dev, *fs_pair(**dict(kwargs, sigma=prior_dev.sigma), impl="triton"),
                             first_cells=first_cells)
    assert torch.equal(via_op, got)

    for (q, k), offset in zip(documents, offsets):
        alone = select_cells(q.to(device, dtype), k.to(device, dtype), config, prior_dev)
        shifted = torch.where(alone >= 0, alone + offset // layout[1], -1)
        assert torch.equal(got[:, offset:offset + q.shape[1]], shifted), f"the document at row {offset}"
        if q.shape[1] <= layout[2]:  # a first block only: no cell of its own before it
            assert (alone == -1).all()




@gpu
@pytest.mark.parametrize("variant", ["fs", "fsl"])
def test_one_launch_per_kernel_however_many_documents(monkeypatch, variant, device):
    gen = torch.Generator().manual_seed(7)
    kwargs = dict(variant=variant, cell_size=4, block_size=8, top_k=2, retained_cells=3, recent_cells=1,
                  sigma=2.0, lam=0.8)
    config, prior = fs_pair(**kwargs)
    one = laid_out_documents(_documents([109], gen), 4, 8)
    many = laid_out_documents(_documents([9, 20, 1, 17, 30, 3], gen), 4, 8)
    assert one[0].shape == many[0].shape and len(set(many[2].tolist())) == 6
    results = {}

    def route(name, layout, documents=True):
        q, k = (x.to(device) for x in layout[:2])
        results[name] = select_cells(q, k, config, prior, first_cells=layout[2] if documents else None)

    counts_one = kernel_launches(monkeypatch, lambda: route("one", one))
    counts_many = kernel_launches(monkeypatch, lambda: route("many", many))
    expected = {("cell_summary_kernel", None): 1, ("select_cells_fwd_kernel", True): 1}
    if variant == "fsl":
        expected[("fsl_retain_kernel", True)] = 1
    assert counts_one == counts_many == expected
    # without documents: the same launches of the variants without them, and one document is the row
    counts_none = kernel_launches(monkeypatch, lambda: route("none", one, documents=False))
    assert counts_none == {(name, None if docs is None else False): n for (name, docs), n in expected.items()}
    assert torch.equal(results["one"], results["none"])


def test_bad_first_cells_are_refused():
    x = torch.randn(1, 32, 1, 16)
    config, prior = fs_pair(variant="fsl", cell_size=4, block_size=8, top_k=2, retained_cells=2, recent_cells=1)
    with pytest.raises(ValueError, match="first_cells"):  # one per query block
        select_cells(x, x, config, prior, first_cells=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="first_cells"):  # the offset form has no documents
        select_cells(x[:, 16:], x, config, prior, q_start=16, first_cells=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="first_cells"):  # a block's first cell after its start
        select_cells(x, x, config, prior, first_cells=torch.tensor([0, 0, 6, 6]))
    # a document starting at block 2 whose block 3 names cell 2 (block 1's start) as its first
    with pytest.raises(ValueError, match="first block"):
        select_cells(x, x, config, prior, first_cells=torch.tensor([0, 0, 0, 2]))
