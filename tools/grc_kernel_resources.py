"""Compile the Triton GRC tree-scan kernels for a GPU target without a GPU and print their
shared memory use (docs/argrc.md §8).

    python tools/grc_kernel_resources.py --widths 512,1536 --arch 90

sm_90 (H100/H200) allows 232,448 bytes of shared memory per block.
"""

from __future__ import annotations

import argparse

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fsf_kernels.grc_scan import cell

PAIR_STRIDES = {name: "i32" for name in ("ROWS", "stride_ab", "stride_am", "stride_bb", "stride_bm")}
SHARED_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}


def compile_all(width: int, arch: int, dtype: str) -> dict[str, int]:
    """{kernel: shared bytes} at scan width `width` (the matmuls' tiles do not depend on it;
    the row kernels hold whole rows of `next_power_of_2(width)`)."""
    target = GPUTarget("cuda", arch, 32)
    ptr = f"*{dtype}"
    block_d = triton.next_power_of_2(width)
    results = {}
    matmul_sig = {name: ptr for name in ("a_ptr", "a2_ptr", "b_ptr", "c_ptr", "bias_ptr", "z_ptr", "pre_ptr")}
    matmul_sig.update({name: "i32" for name in ("M", "N", "K", "K_SPLIT", "ROWS", "stride_ab", "stride_a2b", "stride_am", "stride_ak", "stride_a2m",
                                                "stride_a2k", "stride_bk", "stride_bn", "stride_cm", "stride_cn")})
    for label, flags in (("matmul W1 + GELU (pair)", dict(HAS_BIAS=True, PAIR=True, EPILOGUE=cell.GELU, STORE_PRE=True)),
                         ("matmul W2", dict(HAS_BIAS=True, PAIR=False, EPILOGUE=cell.PLAIN, STORE_PRE=False)),
                         ("matmul dY W2 * GELU'", dict(HAS_BIAS=False, PAIR=False, EPILOGUE=cell.GELU_GRAD,
                                                       STORE_PRE=False))):
        consts = dict(flags, DT=getattr(triton.language, "float32" if dtype == "fp32" else "bfloat16"),
                      PREC="tf32", BLOCK_M=cell.BLOCK_M, BLOCK_N=cell.BLOCK_N,
                      BLOCK_K=cell.BLOCK_K)
        sig = dict(matmul_sig, **{k: "constexpr" for k in consts})
        compiled = triton.compile(ASTSource(cell.matmul_kernel, sig, consts), target=target)
        results[label] = compiled.metadata.shared
    row_consts = dict(BLOCK_M=cell.ROW_BLOCK, BLOCK_D=block_d)
    fwd_sig = {n: ptr for n in ("a_ptr", "b_ptr", "y_ptr", "w_ptr", "beta_ptr", "m_ptr")}
    fwd_sig.update(M="i32", D="i32", eps="fp32", **PAIR_STRIDES, BLOCK_M="constexpr", BLOCK_D="constexpr")
    compiled = triton.compile(ASTSource(cell.gates_ln_fwd_kernel, fwd_sig, row_consts), target=target)
    results["gates + LayerNorm forward"] = compiled.metadata.shared
    bwd_sig = {n: ptr for n in ("a_ptr", "b_ptr", "y_ptr", "w_ptr", "dm_ptr", "dy_ptr")}
    bwd_sig.update(dab_ptr="*fp32", xh_ptr="*fp32", M="i32", D="i32", eps="fp32", **PAIR_STRIDES,
                   BLOCK_M="constexpr", BLOCK_D="constexpr")
    compiled = triton.compile(ASTSource(cell.gates_ln_bwd_kernel, bwd_sig, row_consts), target=target)
    results["gates + LayerNorm backward"] = compiled.metadata.shared
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="512,1536")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    args = parser.parse_args()
    limit = SHARED_LIMIT.get(args.arch)
    for width in (int(w) for w in args.widths.split(",")):
        for label, shared in compile_all(width, args.arch, args.dtype).items():
            verdict = "" if limit is None else ("ok" if shared <= limit else "OVER THE LIMIT")
            print(f"D={width:5d} sm_{args.arch} {args.dtype} {label:28s} shared {shared:7d} B  {verdict}")


if __name__ == "__main__":
    main()
