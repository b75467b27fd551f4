"""FS-B's forest beam search (docs/freesolo.md §1.8): one launch for the queries of many blocks, each
in its block's state of the forests."""

from fsf_kernels.fsb_search.beam_search import beam_search

__all__ = ["beam_search"]
