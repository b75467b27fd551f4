"""PNG plots of an evaluation result (the dict `suite.run_eval` returns).

Figures are built with `matplotlib.figure.Figure` and the Agg canvas directly, so
no pyplot state or display backend is involved (safe in headless jobs and tests).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fsframework.eval.perplexity import PERPLEXITY_TASKS


def _figure(width: float = 6.4, height: float = 4.2) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, format="png")
    return str(path)


def _lengths(series: dict) -> list[int]:
    return sorted(int(k) for k in series)


def plot_scores_vs_length(scores: dict[str, dict[str, float | None]], path: Path,
                          title: str = "Score vs context length") -> str:
    """One line per task: score (0-100) against length, log-2 length axis; a floor (a series named
    `*_floor`, e.g. associative recall's) dashed."""
    fig = _figure()
    ax = fig.add_subplot()
    if _task_lines(ax, scores):
        ax.legend(fontsize=7, loc="best")
    ax.set_ylim(-3, 103)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("score")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _task_lines(ax, scores: dict[str, dict[str, float | None]]) -> bool:
    """One line per task against length (log-2 axis), a floor (a series named `*_floor`) dashed;
    whether any task had a value."""
    plotted = False
    for task, series in sorted(scores.items()):
        xs = [n for n in _lengths(series) if series[str(n)] is not None]
        if xs:
            ax.plot(xs, [series[str(n)] for n in xs], marker="o", label=task,
                    linestyle="--" if task.endswith("_floor") else "-")
            plotted = True
    ax.set_xscale("log", base=2)
    return plotted


def plot_heatmap(table: dict[str, dict[str, float | None]], path: Path, *, row_label: str, title: str) -> str:
    """Heat map with lengths as columns and the inner keys (depths, fact counts) as rows."""
    import numpy as np

    lengths = _lengths(table)
    rows = sorted({float(r) for series in table.values() for r in series})
    keys = {float(r): r for series in table.values() for r in series}
    grid = np.full((len(rows), len(lengths)), np.nan)
    for j, n in enumerate(lengths):
        for i, r in enumerate(rows):
            value = table[str(n)].get(keys[r])
            if value is not None:
                grid[i, j] = value
    fig = _figure(1.6 + 0.9 * len(lengths), 1.4 + 0.35 * len(rows))
    ax = fig.add_subplot()
    image = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(rows)), [f"{r:g}" for r in rows])
    for i in range(len(rows)):
        for j in range(len(lengths)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(row_label)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="score")
    return _save(fig, path)


def plot_perplexity(series: dict[str, dict[str, float | None]], path: Path) -> str:
    """One line per perplexity task (`perplexity`, `doc_perplexity`) against length, its floor (a
    series named `*_floor`) dashed; log-2 length axis, log perplexity axis."""
    fig = _figure()
    ax = fig.add_subplot()
    if _task_lines(ax, series):  # a log axis needs at least one positive value
        ax.set_yscale("log")
        ax.legend(fontsize=7, loc="best")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title("Perplexity vs context length")
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def write_plots(results: dict, plots_dir: str | Path) -> list[str]:
    """Every plot the result supports; returns the written paths."""
    out = Path(plots_dir)
    out.mkdir(parents=True, exist_ok=True)
    scores, breakdown = results.get("scores", {}), results.get("breakdown", {})
    paths = []
    # perplexities (and their floors) have a scale of their own: not on the 0-100 score plot
    perplexities = {t: s for t, s in scores.items() if t.removesuffix("_floor") in PERPLEXITY_TASKS}
    task_scores = {t: s for t, s in scores.items() if t not in perplexities}
    if task_scores:
        paths.append(plot_scores_vs_length(task_scores, out / "score_vs_length.png"))
    if results.get("ruler_mean"):  # the suite mean beside its floor (each task's floor is in the JSON and table)
        paths.append(plot_scores_vs_length({"ruler_mean": results["ruler_mean"],
                                            "ruler_mean_floor": results.get("ruler_mean_floor", {})},
                                           out / "ruler_mean_vs_length.png"))
    if breakdown.get("passkey"):
        paths.append(plot_heatmap(breakdown["passkey"], out / "passkey_depth_length.png", row_label="depth (%)",
                                  title="Passkey retrieval"))
    if breakdown.get("ffact"):
        paths.append(plot_heatmap(breakdown["ffact"], out / "ffact_facts_length.png", row_label="facts F",
                                  title="F-fact memory probe"))
    if any(perplexities.values()):
        paths.append(plot_perplexity(perplexities, out / "perplexity_vs_length.png"))
    return paths


def plot_runs(summaries, path: Path) -> str:
    """Training loss (and validation loss, dashed) and tokens/s against step, one colour per run
    (`fsframework.checkpoints.run_summary.RunSummary`), side by side."""
    fig = _figure(width=11.0)
    loss_ax, speed_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for s in summaries:
        steps = [r["step"] for r in s.records if r.get("loss") is not None]
        line, = loss_ax.plot(steps, [r["loss"] for r in s.records if r.get("loss") is not None], label=s.name)
        val = [(r["step"], r["val/loss"]) for r in s.records if r.get("val/loss") is not None]
        if val:
            loss_ax.plot(*zip(*val), linestyle="--", color=line.get_color(), label=f"{s.name} (val)")
        fast = [(r["step"], r["tokens_per_s"]) for r in s.records if r.get("tokens_per_s") is not None]
        if fast:
            speed_ax.plot(*zip(*fast), color=line.get_color(), label=s.name)
    loss_ax.set(xlabel="step", ylabel="loss", title="Loss")
    speed_ax.set(xlabel="step", ylabel="tokens/s", title="Throughput")
    for ax in (loss_ax, speed_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)
