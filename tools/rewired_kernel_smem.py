"""Compile the rewired-attention kernels for a GPU target on any machine and print their shared memory.

    python tools/rewired_kernel_smem.py [--arch 90] [--dims 64 128]

No GPU needed: Triton compiles to PTX for the target and reports `metadata.shared`
(bytes of shared memory per program), to compare with the per-block limits
(sm_90: 232,448 B; sm_80: 166,912 B).
"""

from __future__ import annotations

import argparse

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fsf_kernels.rewired_attention import rewired_attention as module

LIMITS = {90: 232_448, 80: 166_912}


def compile_shared(fn, signature: dict, constexprs: dict, arch: int) -> int:
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs={})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32)).metadata.shared


def kernels(dim: int, dtype: str):
    dt = {"bf16": triton.language.bfloat16, "fp32": triton.language.float32}[dtype]
    ptr = f"*{dtype}"
    tile = module.tiles({"bf16": torch.bfloat16, "fp32": torch.float32}[dtype], dim)
    meta = dict(D=dim, BD=max(16, triton.next_power_of_2(dim)), BM=tile, BN=tile, DT=dt,
                PREC="ieee" if dtype == "fp32" else "tf32")
    ints = {"n": "i32", "T": "i32", "H": "i32", "q_start": "i32", "qk_scale": "fp32"}
    fwd = {"q": ptr, "k": ptr, "v": ptr, "r": ptr, "u": ptr, "o": ptr, "lse": "*fp32", **ints}
    dkdv = {"q": ptr, "k": ptr, "v": ptr, "r": ptr, "u": ptr, "do": ptr, "lse": "*fp32", "delta": "*fp32",
            "dk": "*fp32", "dv": ptr, "du_h": "*fp32", **ints, "scale": "fp32"}
    dq = {"q": ptr, "k": ptr, "v": ptr, "r": ptr, "u": ptr, "do": ptr, "lse": "*fp32", "delta": "*fp32",
          "dq": "*fp32", "dr_h": "*fp32", **ints, "scale": "fp32"}
    return [("fwd", module.rewired_fwd_kernel, fwd, meta), ("bwd dk/dv/du", module.rewired_bwd_dkdvdu_kernel, dkdv, meta),
            ("bwd dq/dr", module.rewired_bwd_dqdr_kernel, dq, meta)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90, 80])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    args = parser.parse_args()
    print("| arch | dtype | head dim | tile | kernel | shared (B) | limit (B) |\n|---|---|---|---|---|---|---|")
    for arch in args.arch:
        for dtype in args.dtypes:
            for dim in args.dims:
                for name, fn, sig, meta in kernels(dim, dtype):
                    shared = compile_shared(fn, sig, meta, arch)
                    flag = "" if shared <= LIMITS.get(arch, shared) else " OVER"
                    print(f"| sm_{arch} | {dtype} | {dim} | {meta['BM']} | {name} | {shared:,} | {LIMITS.get(arch, 0):,}{flag} |",
                          flush=True)


if __name__ == "__main__":
    main()
