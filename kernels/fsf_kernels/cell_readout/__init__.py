"""FreeSolo selected-cell readout: joint softmax over the chosen cells, then RMSNorm (docs/freesolo.md §1.6)."""

from fsf_kernels.cell_readout.cell_readout import (
    CellReadoutFunction,
    cell_readout,
    cell_readout_bwd,
    cell_readout_fwd,
    unique_cells,
)

__all__ = ["CellReadoutFunction", "cell_readout", "cell_readout_bwd", "cell_readout_fwd", "unique_cells"]
