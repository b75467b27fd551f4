"""Compile every kernel for sm_80, sm_86 and sm_90 without a GPU and check its shared memory fits.

    python -m fsf_kernels.compile_check [--full] [--arch 80 86 90] [--json]

A configuration is one call the dispatcher can hand a kernel (dtype, head dim, K, P, FS / FS-L,
...); its launches are the compiled variants that call uses, built from the launchers' own tile
choices (`fsf_kernels.common.support`), so what is checked is what a GPU will run. Launches
shared by several configurations compile once per process (`fsf_kernels.common.targets`).

`--full` sweeps every configuration the limits allow (every padded head dim 16..256, the three
dtypes, K and P up to their maxima); without it, a representative set covering the extremes of
each kernel (the default test suite's, tests/kernels/test_compile_targets.py). Head dims that
pad to the same tile (e.g. 96 and 128) give the same tiles and shared memory, so dims are the
padded powers of two.
Run with TRITON_INTERPRET unset: the interpreter's kernels cannot be compiled.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch

from fsf_kernels.common import support
from fsf_kernels.common.targets import TARGETS, compile_for, launch, ptr
from fsf_kernels.common.utils import dot_args, next_pow2

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
_NAMES = {F32: "fp32", F16: "fp16", BF16: "bf16", F64: "fp64"}
DIMS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Config:
    kernel: str  # window, routing, readout, rewired, grc_scan, common
    params: tuple  # ((name, value), ...) passed to the kernel's launch builder
    only: str = ""  # compile only the launches whose label contains this (the one with the most shared memory)

    @property
    def name(self) -> str:
        parts = [self.kernel] + [f"{k}{_NAMES.get(v, v)}" if k != "dtype" else _NAMES[v] for k, v in self.params]
        return "-".join(str(p) for p in parts) + (f"-{self.only.replace(' ', '').replace('/', '')}" if self.only else "")


def _cfg(kernel: str, only: str = "", **params) -> Config:
    return Config(kernel, tuple(params.items()), only)


# each family's kernel module is imported when one of its configurations is checked (below), so a
# test that checks one configuration defines the kernels of that family alone
def _window(arch, dtype, dim):
    from fsf_kernels.window_attention import window_attention

    return window_attention.launches(dtype, dim, arch)


def _routing(arch, dtype, dim, variant, top_k, retained, cell_size, block_size):
    from fsf_kernels.cell_routing import cell_routing as m

    # the launcher's own tiles, with and without documents
    return m.launches(dtype, dim, variant, top_k, retained, cell_size, block_size, arch)


def _readout(arch, dtype, dim, top_k, cell_size):
    import importlib

    # the package exports a function of the module's name: fetch the module itself
    return importlib.import_module("fsf_kernels.cell_readout.cell_readout").launches(dtype, dim, cell_size, top_k,
                                                                                     arch)


def _rewired(arch, dtype, dim):
    from fsf_kernels.rewired_attention import rewired_attention as m

    return m.launches(dtype, dim, arch)  # the launcher's own tiles and stages, with and without documents


def _grc_scan(arch, dtype, width):
    from fsf_kernels.grc_scan import cell

    p = ptr(dtype)
    out = []
    mm_ptrs = {n: p for n in ("a_ptr", "a2_ptr", "b_ptr", "c_ptr", "bias_ptr", "z_ptr", "pre_ptr")}
    tiles = dict(BLOCK_M=cell.BLOCK_M, BLOCK_N=cell.BLOCK_N, BLOCK_K=cell.BLOCK_K, **dot_args(dtype, gpu=True))
    for label, flags in (("grc matmul W1 + GELU (pair)", dict(HAS_BIAS=True, PAIR=True, EPILOGUE=cell.GELU,
                                                              STORE_PRE=True)),
                         ("grc matmul W2", dict(HAS_BIAS=True, PAIR=False, EPILOGUE=cell.PLAIN, STORE_PRE=False)),
                         ("grc matmul dY W2 * GELU'", dict(HAS_BIAS=False, PAIR=False, EPILOGUE=cell.GELU_GRAD,
                                                           STORE_PRE=False))):
        out.append(launch(label, cell.matmul_kernel, mm_ptrs, dict(flags, **tiles)))
    rows = dict(BLOCK_M=cell.ROW_BLOCK, BLOCK_D=next_pow2(width))
    out.append(launch("grc gates + LayerNorm fwd", cell.gates_ln_fwd_kernel,
                      {n: p for n in ("a_ptr", "b_ptr", "y_ptr", "w_ptr", "beta_ptr", "m_ptr")}, rows,
                      floats={"eps"}))
    out.append(launch("grc gates + LayerNorm bwd", cell.gates_ln_bwd_kernel,
                      dict({n: p for n in ("a_ptr", "b_ptr", "y_ptr", "w_ptr", "dm_ptr", "dy_ptr")},
                           dab_ptr="*fp32", xh_ptr="*fp32"), rows, floats={"eps"}))
    return out


def _fsb_search(arch, dtype, dim, beam_width):
    import importlib

    # the package exports the function `beam_search`: fetch the module of that name
    return importlib.import_module("fsf_kernels.fsb_search.beam_search").launches(dtype, dim, beam_width, arch)


def _common(arch, dtype, dim):
    from fsf_kernels.common import rope, softmax_bwd

    p = ptr(dtype)
    half = max(dim // 2, 1)
    rows = {bm for bm, _, _ in (support.window_tiles(dtype, dim, arch),)} | {64}
    out = [launch("rope", rope.rope_kernel, dict(x=p, y=p, cos="*fp32", sin="*fp32"),
                  dict(HALF=half, BH=next_pow2(half), BT=32, SIGN=sign)) for sign in (1.0, -1.0)]
    out += [launch("softmax bwd delta", softmax_bwd.softmax_bwd_delta_kernel, dict(o=p, do=p, delta="*fp32"),
                   dict(D=dim, BD=support.padded_dim(dim), BM=bm)) for bm in sorted(rows)]
    return out


BUILDERS = {"window": _window, "routing": _routing, "readout": _readout, "rewired": _rewired,
            "grc_scan": _grc_scan, "fsb_search": _fsb_search, "common": _common}


def configurations(full: bool = False) -> list[Config]:
    """The configurations to check: every one the limits allow (`full`), or the extremes of each kernel."""
    kmax, pmax, smax = support.MAX_TOP_K, support.MAX_RETAINED, support.MAX_CELL_SIZE
    dtypes = (F32, F16, BF16)
    out = []
    if full:
        for dt in dtypes:
            for d in DIMS:
                out += [_cfg("window", dtype=dt, dim=d), _cfg("rewired", dtype=dt, dim=d),
                        _cfg("common", dtype=dt, dim=d)]
                for k in (1, 4, 16, kmax):
                    out.append(_cfg("routing", dtype=dt, dim=d, variant="fs", top_k=k, retained=0, cell_size=32,
                                    block_size=128))
                    out.append(_cfg("routing", dtype=dt, dim=d, variant="fsl", top_k=k, retained=pmax, cell_size=32,
                                    block_size=128))
                    for s in (8, 32, min(smax, support.MAX_CELL_TILE // d)):
                        out.append(_cfg("readout", dtype=dt, dim=d, top_k=k, cell_size=s))
                if dt == F32:  # the search runs in its summaries' dtype: fp32 or fp64
                    out += [_cfg("fsb_search", dtype=sdt, dim=d, beam_width=wb)
                            for sdt in (F32, F64) for wb in (1, 16, support.MAX_BEAM_WIDTH)]
            for width in (64, 512, 1536, support.MAX_SCAN_WIDTH):
                out.append(_cfg("grc_scan", dtype=dt, width=width))
            for p, s, blk in ((64, 32, 128), (16, 4, 256), (pmax, 8, 8 * support.MAX_NEW_CELLS)):
                out.append(_cfg("routing", dtype=dt, dim=64, variant="fsl", top_k=4, retained=p, cell_size=s,
                                block_size=blk))
        return out
    # representative, within the default suite's time: each kernel at its largest tiles (d = 256, the
    # largest K, P and cell size), the tile changes of the window kernel (half d = 256, whose tiles
    # differ per target; fp32 d = 128, 32 x 32 tiles), the tightest fits measured, and the
    # 340M recipe's routing. Launches compile slowly (seconds each, fp32 the slowest: exact fp32
    # dots), so of a kernel's launches mostly the one with the most shared memory.
    out.append(_cfg("window", dtype=BF16, dim=256, only="dk/dv"))  # of the three, the most shared memory
    out.append(_cfg("window", dtype=F32, dim=128, only="dk/dv"))
    out.append(_cfg("window", dtype=F32, dim=64, only="dk/dv"))  # sm_86's tightest: 115,712 B with 3 stages
    out.append(_cfg("rewired", dtype=BF16, dim=256, only="dk/dv"))
    out.append(_cfg("rewired", dtype=F32, dim=64, only="dk/dv"))  # the tightest fit: 164,864 B on sm_80
    out.append(_cfg("rewired", dtype=F32, dim=256, only="dk/dv"))  # sm_86's tightest: 99,456 B with 2 stages
    out.append(_cfg("routing", dtype=BF16, dim=256, variant="fsl", top_k=kmax, retained=pmax, cell_size=32,
                    block_size=128))
    out.append(_cfg("routing", dtype=BF16, dim=64, variant="fs", top_k=4, retained=0, cell_size=32, block_size=128,
                    only="scorer"))
    out.append(_cfg("readout", dtype=BF16, dim=256, top_k=kmax, cell_size=support.MAX_CELL_TILE // 256))
    out.append(_cfg("readout", dtype=BF16, dim=64, top_k=kmax, cell_size=smax, only="readout bwd"))
    out.append(_cfg("readout", dtype=F32, dim=256, top_k=kmax, cell_size=support.MAX_CELL_TILE // 256,
                    only="readout bwd"))
    # the GRC matmuls have fixed tiles and the row kernels hold no tiles in shared memory (64 and
    # 4,096 B at the widest rows): one matmul stands for them here
    out.append(_cfg("grc_scan", dtype=BF16, width=support.MAX_SCAN_WIDTH, only="W1"))
    out.append(_cfg("common", dtype=BF16, dim=256, only="delta"))
    # FS-B's search holds its beam and the children's mean keys in registers, no shared-memory tile
    out.append(_cfg("fsb_search", dtype=F32, dim=256, beam_width=support.MAX_BEAM_WIDTH))
    return out


def launches(config: Config, arch: int) -> list:
    return [item for item in BUILDERS[config.kernel](arch, **dict(config.params)) if config.only in item.label]


def check(config: Config, arch: int) -> list[dict]:
    """Compile the configuration's launches for sm_`arch`: one record per launch."""
    rows = []
    for item in launches(config, arch):
        try:
            c = compile_for(item, arch)
            rows.append(dict(config=config.name, arch=arch, kernel=item.label, shared=c.shared, limit=c.limit,
                             fits=c.fits, seconds=round(c.seconds, 2), error=None))
        except Exception as exc:  # a kernel that does not compile is a finding, reported with the rest
            rows.append(dict(config=config.name, arch=arch, kernel=item.label, shared=None,
                             limit=None, fits=False, seconds=None, error=f"{type(exc).__name__}: {exc}"[:2000]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="every configuration the limits allow")
    parser.add_argument("--arch", type=int, nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--only", default="", help="only configurations whose name contains this")
    parser.add_argument("--json", action="store_true", help="one JSON record per launch")
    args = parser.parse_args(argv)
    bad = 0
    if not args.json:
        print("| config | target | kernel | shared (B) | limit (B) | compile (s) |\n|---|---|---|---|---|---|")
    for config in configurations(args.full):
        if args.only not in config.name:
            continue
        for arch in args.arch:
            for row in check(config, arch):
                bad += not row["fits"]
                if args.json:
                    print(json.dumps(row), flush=True)
                elif row["error"]:
                    print(f"| {row['config']} | sm_{arch} | {row['kernel']} | ERROR {row['error'][:200]} | | |")
                else:
                    flag = "" if row["fits"] else " OVER"
                    print(f"| {row['config']} | sm_{arch} | {row['kernel']} | {row['shared']:,}{flag} | "
                          f"{row['limit']:,} | {row['seconds']} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
