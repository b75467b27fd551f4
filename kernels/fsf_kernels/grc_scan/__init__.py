"""AR-GRC tree scan: the GRC cell of one tree level in Triton, the whole tree with a
hand-written backward (docs/argrc.md §2-§3)."""

from fsf_kernels.grc_scan.cell import grc_cell_bwd, grc_cell_fwd
from fsf_kernels.grc_scan.packed import GRCPackedTreeScan, grc_packed_exclusive_scan
from fsf_kernels.grc_scan.tree import GRCTreeScan, grc_exclusive_scan

__all__ = ["GRCPackedTreeScan", "GRCTreeScan", "grc_cell_bwd", "grc_cell_fwd", "grc_exclusive_scan",
           "grc_packed_exclusive_scan"]
