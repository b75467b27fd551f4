"""FreeSolo selected-cell readout: joint softmax over the chosen cells, then RMSNorm (docs/freesolo.md §1.6)."""

from fsf_kernels.cell_readout.cell_readout import (
    DKDV,
    CellReadoutFunction,
    cell_readout,
    cell_readout_bwd,
    cell_readout_fwd,
    selections_by_cell,
    unique_cells,
    unique_cells_reference,
)

__all__ = ["DKDV", "CellReadoutFunction", "cell_readout", "cell_readout_bwd", "cell_readout_fwd", "selections_by_cell",
           "unique_cells", "unique_cells_reference"]
