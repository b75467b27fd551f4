"""FreeSolo cell routing: FS / FS-L top-K cell selection (docs/freesolo.md §1.3-§1.6)."""

from fsf_kernels.cell_routing.cell_routing import (cell_summaries, cell_summary_fwd, fsl_retain_fwd, select_cells,
                                                   select_cells_from_summaries, select_cells_fwd)

__all__ = ["cell_summaries", "cell_summary_fwd", "fsl_retain_fwd", "select_cells", "select_cells_from_summaries",
           "select_cells_fwd"]
