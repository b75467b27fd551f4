"""FS-B's search over packed documents in one call (`first_cells`, docs/freesolo.md §1.12).

Documents are laid end to end in a row, each from a query-block boundary (`fsframework.ops.freesolo_documents`);
a block's forests must hold only its own document's cells, grown from the document's first cell, so
every document selects exactly the cells it selects when searched alone (shifted by its first cell):
with both forests and each alone, with beams that drop nodes (the forests' shape decides what is
found), with the forests built a few blocks at a time, and with the search's Triton kernel.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fsframework.models.freesolo_settings import fs_pair
from fsframework.ops.freesolo import select_cells
from kernel_testing import kernel_launches, laid_out_documents

# lengths not multiples of the cell (4) or block (16), two within one block (nothing long range), a
# document of whole blocks, one long enough that its forests hold chunks of 8 and 16 cells
LENGTHS = [37, 9, 150, 13, 64, 90]
CELL, BLOCK, HEADS, DIM = 4, 16, 2, 8


def _documents(lengths, seed, batch=2):
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(batch, n, HEADS, DIM, generator=gen) for _ in range(2)) for n in lengths]


def _pair(forests: str, impl: str = "reference", beam_width: int = 3):
    # tau near the keys' norm quantiles: Ftau admits some cells of each document, not all
    return fs_pair(variant="fsb", cell_size=CELL, block_size=BLOCK, top_k=2, beam_width=beam_width, forests=forests,
                   impl=impl, sigma=torch.tensor([3.0, 12.0]), lam=0.7, tau=torch.tensor([3.0, 3.2]))


@pytest.mark.parametrize("forests", ["both", "f0", "ftau"])
def test_each_document_selects_what_it_selects_alone(forests):
    documents = _documents(LENGTHS, seed=3)
    q_row, k_row, first_cells, offsets = laid_out_documents(documents, CELL, BLOCK)
    config, prior = _pair(forests)
    got = select_cells(q_row, k_row, config, prior, first_cells=first_cells)
    assert got.shape == (2, q_row.shape[1], HEADS, 2)
    for (q, k), offset in zip(documents, offsets):
        alone = select_cells(q, k, config, prior)
        shifted = torch.where(alone >= 0, alone + offset // CELL, -1)
        assert torch.equal(got[:, offset:offset + q.shape[1]], shifted), f"the document at row {offset}"
    # the documents' own cells only: the row read whole finds cells of earlier documents (the test can fail)
    whole = select_cells(q_row, k_row, config, prior)
    assert not torch.equal(whole, got)


def test_windows_of_blocks_restart_at_each_document(monkeypatch):
    """Under the smallest memory budget the forests are built a few blocks at a time; a window that
    spans two documents builds each one's chunks from its own first cell."""
    import fsframework.ops.fsb_search as search

    documents = _documents(LENGTHS, seed=4)
    q_row, k_row, first_cells, _ = laid_out_documents(documents, CELL, BLOCK)
    config, prior = _pair("both")
    whole_window = select_cells(q_row, k_row, config, prior, first_cells=first_cells)
    monkeypatch.setattr(search, "STATES_BUDGET_BYTES", 0)
    assert torch.equal(select_cells(q_row, k_row, config, prior, first_cells=first_cells), whole_window)


def test_the_search_kernel_reads_documents_as_the_reference_does(monkeypatch, device):
    """impl=triton: the beams search the same per-document forests, every block's queries in one launch
    (each reads its block's state of the forests; a document's first block searches nothing)."""
    documents = _documents([20, 45, 23], seed=5, batch=1)  # the interpreter's seconds go to each program
    q_row, k_row, first_cells, _ = laid_out_documents(documents, CELL, BLOCK)
    q_row, k_row = q_row.to(device), k_row.to(device)

    def pair(impl):  # one forest: the interpreter runs a program per (row, head, forest, query)
        config, prior = _pair("f0", impl=impl)
        return config, dataclasses.replace(prior, sigma=prior.sigma.to(device), tau=prior.tau.to(device))

    want = select_cells(q_row, k_row, *pair("reference"), first_cells=first_cells)
    results = {}

    def run():
        results["got"] = select_cells(q_row, k_row, *pair("triton"), first_cells=first_cells)

    launches = kernel_launches(monkeypatch, run)
    assert torch.equal(results["got"], want) and bool((want >= 0).any())
    blocks_with_cells = sum(1 for j, first in enumerate(first_cells.tolist()) if first * CELL < j * BLOCK)
    assert blocks_with_cells == 4 and sum(n for (name, _), n in launches.items() if name.startswith("fsb")) == 1


def test_first_cells_that_do_not_fit_are_refused():
    x = torch.randn(1, 64, HEADS, DIM)
    config, prior = _pair("both")
    with pytest.raises(ValueError, match="first_cells"):
        select_cells(x, x, config, prior, first_cells=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="first_cells"):
        select_cells(x, x, config, prior, first_cells=torch.tensor([0, 0, 5, 4]))
