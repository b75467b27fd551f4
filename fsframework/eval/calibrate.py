"""FS-B calibration (docs/freesolo.md §1.8): per-head median key-norm thresholds of a checkpoint.

`calibrate(checkpoint, ...)` runs the checkpoint's own model (FS or FS-L) over `windows`
windows of `seq_len` tokens of held-out text (a run on `data.source=mqar`: recall rows of
its sizes, 64 of its `data.seq_len` unless given; by default the run's eval split; its first
`4 x windows x seq_len` tokens, or all of it when shorter, are cut into consecutive windows
and `windows` of them drawn with `seed`; left unset, they are 64 windows of 4096 tokens, or
as many as a smaller held-out split holds, of the run's `data.seq_len` when it holds no
4096-token window), collects `a_c = max_{j in c} ||k_j||` of
every complete cell from the unrotated keys of every FreeSolo layer and head, and
writes the pooled median per (layer, head) as `tau` into `<checkpoint>/calibration.json`
with a heat map `calibration.png` beside it. FS-B's `Ftau` admits `a_c >= tau`.

[choice] The median of an even count is the lower middle value (an observed `a_c`,
so at least half of the calibration cells pass `a_c >= tau`); every value is kept, so
the median is exact, also under torchrun, where each rank runs every `world`-th window
and the values are gathered (they are few: windows x seq_len / cell_size per head).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from fsframework.checkpoints import CALIBRATION_FILE, Checkpoint, load_model
from fsframework.config.kinds import kind_facts
from fsframework.config.sources import reads_text
from fsframework.data.mixture import HeldOutStream, heldout_streams
from fsframework.data.mqar import recall_rows
from fsframework.eval.perplexity import heldout_tokens
from fsframework.models.freesolo_attention import freesolo_layers
from fsframework.parallel.process_group import init_distributed, shutdown

HEATMAP_FILE = "calibration.png"
DEFAULT_WINDOWS, DEFAULT_SEQ_LEN = 64, 4096


def mixture_windows(streams: list[np.ndarray], weights: list[float], windows: Optional[int], seq_len: Optional[int],
                    run_seq_len: int, seed: int, labels: list[str]) -> torch.Tensor:
    """`[count, length]` calibration windows from the held-out text of every stream of the mixture.

    One stream: `default_windows` then `calibration_windows` with `seed`. Several: the window length
    and count as for their text together, the count shared out by the mixture weights (at least one
    window each, largest remainders for the rest; with the defaults, no stream gives more than it
    holds), each stream's windows drawn as one stream's with `seed + i`, in stream order.
    """
    if len(streams) == 1:
        return calibration_windows(streams[0], *default_windows(streams[0], windows, seq_len, run_seq_len), seed)
    count, length = default_windows(np.concatenate(streams), windows, seq_len, run_seq_len)
    shares = apportion(count, weights)
    if windows is None:  # the defaults take what each stream holds
        shares = [min(share, len(stream) // length) for share, stream in zip(shares, streams)]
    cut = []
    for i, (stream, share, label) in enumerate(zip(streams, shares, labels)):
        if share == 0:
            continue
        try:
            cut.append(calibration_windows(stream, share, length, seed + i))
        except ValueError as exc:
            raise ValueError(f"stream {label}: {exc}") from None
    if not cut:
        raise ValueError(f"the held-out text of the streams holds no window of {length} tokens: lower --seq-len")
    return torch.cat(cut)


def apportion(count: int, weights: list[float]) -> list[int]:
    """`count` split by `weights` (summing to 1): one each first while there are enough, then the
    rest by largest remainders (ties to the earlier stream)."""
    base = [1] * len(weights) if count >= len(weights) else [0] * len(weights)
    rest = count - sum(base)
    raw = [rest * w for w in weights]
    shares = [b + int(r) for b, r in zip(base, raw)]
    left = count - sum(shares)
    for i in sorted(range(len(weights)), key=lambda i: (int(raw[i]) - raw[i], i))[:left]:
        shares[i] += 1
    return shares


def calibration_windows(stream: np.ndarray, windows: int, seq_len: int, seed: int) -> torch.Tensor:
    """`[windows, seq_len]` token windows: the stream cut into consecutive windows, shuffled with `seed`."""
    available = len(stream) // seq_len
    if available < windows:
        raise ValueError(f"the calibration text holds {available} windows of {seq_len} tokens, fewer than "
                         f"--windows {windows}: lower --windows or --seq-len, or give more text with --data")
    order = torch.randperm(available, generator=torch.Generator().manual_seed(seed))[:windows]
    cut = torch.from_numpy(stream[: available * seq_len].astype(np.int64)).view(available, seq_len)
    return cut[order]


class KeyNormRecorder:
    """Forward hooks on the key projections of FreeSolo layers: `a_c` of every complete cell,
    kept per layer as a list of `[cells, H]` float64 tensors (rows in window order)."""

    def __init__(self, layers, cell_size: int):
        self.cell_size = cell_size
        self.values: list[list[torch.Tensor]] = [[] for _ in layers]
        self.handles = [layer.wk.register_forward_hook(self._hook(i, layer.n_heads)) for i, layer in enumerate(layers)]

    def _hook(self, index: int, heads: int):
        def record(_module, _inputs, keys: torch.Tensor) -> None:
            bsz, seq, width = keys.shape
            cells = seq // self.cell_size  # an incomplete trailing cell is never eligible
            k = keys[:, : cells * self.cell_size].detach().double().view(bsz, cells, self.cell_size, heads, -1)
            self.values[index].append(torch.linalg.vector_norm(k, dim=-1).amax(dim=2).flatten(0, 1).cpu())
        return record

    def close(self) -> list[torch.Tensor]:
        for handle in self.handles:
            handle.remove()
        return [torch.cat(v) if v else torch.zeros(0) for v in self.values]


def lower_median(values: torch.Tensor) -> torch.Tensor:
    """Per column of `[n, H]`: the lower middle value of the sorted column (exact, an observed value)."""
    return values.sort(dim=0).values[(values.shape[0] - 1) // 2]


def _world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment (1 process without it)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


@contextmanager
def _alone():
    """Hide torchrun's variables: rank 0 reads the text as a single process (the streaming
    reader would otherwise expect every rank to open the dataset with it)."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _shared_windows(read, rank: int, world: int) -> torch.Tensor:
    """`read()` on rank 0 only, then its windows (or its error) sent to every rank."""
    import torch.distributed as dist

    if world == 1:
        return read()
    result: list = [None]
    if rank == 0:
        with _alone():
            try:
                result[0] = read()
            except (ValueError, FileNotFoundError) as exc:
                result[0] = exc
    # joined only now, after rank 0's read: a streaming reader in a started process group waits
    # at a barrier for every rank to open the dataset, and only rank 0 reads
    init_distributed()
    dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]


def _gather(values: list[torch.Tensor], world: int, window_rows: int) -> list[torch.Tensor]:
    """Every rank's values of every layer, in global window order (rank r ran windows r, r + world, ...)."""
    import torch.distributed as dist

    if world == 1:
        return values
    gathered: list = [None] * world
    dist.all_gather_object(gathered, values)
    out = []
    for layer in range(len(values)):
        per_rank = [g[layer].view(-1, window_rows, g[layer].shape[-1]) for g in gathered]
        total = sum(p.shape[0] for p in per_rank)
        rows = [per_rank[w % world][w // world] for w in range(total)]  # window w came from rank w % world
        out.append(torch.cat(rows))
    return out


def recall_windows(spec, windows: int, seq_len: int, seed: int) -> torch.Tensor:
    """`[windows, seq_len]` associative-recall rows of the run's `data.mqar` sizes (`recall_rows`),
    drawn with `seed`: what a model trained on them is calibrated on."""
    return recall_rows(torch.Generator().manual_seed(seed), spec, windows, seq_len - 1).tokens


def default_windows(stream: np.ndarray, windows: Optional[int], seq_len: Optional[int],
                    run_seq_len: int) -> tuple[int, int]:
    """(windows, seq_len) to cut from `stream`: the values given, else the defaults reduced to what
    the held-out text holds (a small run's eval split has few long windows)."""
    length = seq_len or (DEFAULT_SEQ_LEN if len(stream) >= DEFAULT_SEQ_LEN or run_seq_len >= DEFAULT_SEQ_LEN
                         else run_seq_len)
    count = windows or max(1, min(DEFAULT_WINDOWS, len(stream) // length))
    return count, length


def calibrate(checkpoint: str | Path, *, data: Optional[str] = None, windows: Optional[int] = None,
              seq_len: Optional[int] = None, seed: int = 0, batch_size: int = 1, device=None,
              progress: bool = True) -> dict:
    """Compute and write the checkpoint's FS-B thresholds; returns the calibration record.

    data: an MDS directory (default: the held-out split of every stream of the run's data, windows
    drawn from each by its share of the mixture: `mixture_windows`); windows, seq_len: None for the
    defaults that fit the held-out text (`default_windows`). Raises ValueError on bad input.
    Under torchrun the ranks share the windows through a process group that this call starts and
    also leaves, by success or error: a gloo rank that exits with its group up can abort in
    the interpreter's teardown (its worker threads still hold tensors).
    """
    import torch.distributed as dist

    starts_group = _world()[1] > 1 and not dist.is_initialized()
    try:
        return _calibrate(checkpoint, data=data, windows=windows, seq_len=seq_len, seed=seed,
                          batch_size=batch_size, device=device, progress=progress)
    finally:
        if starts_group:
            shutdown()


def _calibrate(checkpoint: str | Path, *, data: Optional[str], windows: Optional[int], seq_len: Optional[int],
               seed: int, batch_size: int, device, progress: bool) -> dict:
    """`calibrate`'s work, in whatever process group it finds or starts."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if (windows is not None and windows < 1) or (seq_len is not None and seq_len < 1) or batch_size < 1:
        raise ValueError(f"--windows ({windows}), --seq-len ({seq_len}) and the batch size ({batch_size}) must be >= 1")
    rank, world = _world()
    if device is None:
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    ckpt = Checkpoint.open(checkpoint)
    cfg = ckpt.config()
    # what is read, found (or a stream without held-out split named) before the model is loaded;
    # a run trained on generated recall rows is calibrated on such rows (it has no held-out text)
    recall = not reads_text(cfg) and not data
    streams = [HeldOutStream("data", 1.0, data)] if data else [] if recall else heldout_streams(cfg, build=False)
    if kind_facts(cfg.model.name).calibrated:
        raise ValueError("calibrate the FS or FS-L checkpoint as it was trained (its saved config), "
                         f"not with model.name={cfg.model.name}")
    model, cfg = load_model(ckpt, device)
    layers = freesolo_layers(model)
    if not layers:
        raise ValueError(f"checkpoint {ckpt.path} is a {cfg.model.name} model: only FreeSolo models (fs, fsl) "
                         "have the key-norm cells FS-B thresholds")
    cell_size = cfg.model.attention.cell_size
    if seq_len is not None and seq_len < cell_size:
        raise ValueError(f"--seq-len {seq_len} is shorter than one cell ({cell_size} tokens)")

    def read() -> tuple[torch.Tensor, str | list[str]]:
        if recall:
            return recall_windows(cfg.data.mqar, windows or DEFAULT_WINDOWS, seq_len or cfg.data.seq_len, seed), "mqar"
        budget = (windows or DEFAULT_WINDOWS) * (seq_len or DEFAULT_SEQ_LEN) * 4
        if not data:
            heldout_streams(cfg)  # builds the embedded corpus on first use (here: one rank)
        texts = [heldout_tokens(s.location, budget) for s in streams]
        tokens = mixture_windows(texts, [s.weight for s in streams], windows, seq_len, cfg.data.seq_len, seed,
                                 [s.label for s in streams])
        locations = [s.location for s in streams]
        return tokens, locations[0] if len(locations) == 1 else locations

    tokens, data_dir = _shared_windows(read, rank, world)
    windows, seq_len = tokens.shape
    mine = tokens[rank::world]
    recorder = KeyNormRecorder(layers, cell_size)
    run = model.hidden_states  # the key norms are all it needs: no [B, T, V] logits
    try:
        with torch.inference_mode(), Progress(TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(),
                                              TimeElapsedColumn(), disable=not progress or rank != 0) as bar:
            task = bar.add_task("windows", total=len(mine))
            for start in range(0, len(mine), batch_size):
                run(mine[start:start + batch_size].to(device))
                bar.advance(task, len(mine[start:start + batch_size]))
    finally:
        values = recorder.close()
    values = _gather(values, world, seq_len // cell_size)
    tau = [lower_median(v).tolist() for v in values]
    record = {"tau": tau, "windows": windows, "seq_len": seq_len, "data": data_dir, "seed": seed,
              "cells": int(values[0].shape[0]), "model": cfg.model.name, "n_layers": len(layers),
              "n_heads": layers[0].n_heads, "cell_size": cell_size, "checkpoint": str(ckpt.path)}
    if rank == 0:
        out = ckpt.path / CALIBRATION_FILE
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, out)
        record["heatmap"] = write_heatmap(tau, ckpt.path / HEATMAP_FILE)
        record["file"] = str(out)
    return record


def write_heatmap(tau: list[list[float]], path: Path) -> str:
    """Layers x heads heat map of the thresholds (PNG)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    layers, heads = len(tau), len(tau[0])
    fig = Figure(figsize=(max(4.0, 0.4 * heads + 2), max(3.0, 0.3 * layers + 1.5)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(np.asarray(tau), aspect="auto", cmap="viridis", origin="upper")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title("FS-B tau: median max key norm per cell")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return str(path)
