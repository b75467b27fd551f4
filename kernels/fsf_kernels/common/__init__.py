"""Tiles and host helpers shared by the fsf_kernels ops."""

from fsf_kernels.common.utils import check_head_dim, dot_args, interpreting, next_pow2

__all__ = ["check_head_dim", "dot_args", "interpreting", "next_pow2"]
