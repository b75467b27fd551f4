"""FS-B's forest beam search (docs/freesolo.md §1.8): one launch per block of queries."""

from fsf_kernels.fsb_search.beam_search import beam_search

__all__ = ["beam_search"]
