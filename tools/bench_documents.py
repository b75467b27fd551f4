"""What document masking costs a training step, per model kind: step time, aten ops and Triton launches.

    python tools/bench_documents.py                                   # every trainable kind, 8 and 64 docs a row
    python tools/bench_documents.py --kinds tfpp,swa,fs,argrc --docs 8,64 --json documents.json
    python tools/bench_documents.py --launches                        # Triton launches, every kind with a kernel
    python tools/bench_documents.py --launches --kinds swa,fs --launch-docs 1,8,64 --json launches.json
    python tools/bench_documents.py --launches --kinds fsb --set model.attention.fsb.beam_width=8

With document masking (`model(tokens, doc_ids=doc_ids)`, docs/training.md "Documents") every
sequence-mixing layer reads each document of a packed row as a row of its own
(`fsframework.models.documents`). This tool measures what that costs against the same rows read
unmasked, so a change to how documents are read (one "varlen" call instead of one call per
distinct document length) can be judged kind by kind.

Step-time mode (the default): for each kind (`--kinds`) and document count (`--docs`), the model of
`yamls/quickstart.yaml` with `model.name=<kind>` on random tokens, `--batch` rows of `--seq-len`
tokens. Each row's documents have exponential lengths of mean seq_len/docs (seeded, at least one
token each, the last one cut so that they fill the row exactly; `doc_ids` are the documents' run
ids). A training step (forward with targets, the losses' mean, backward) is timed unmasked
(`doc_ids=None`) and masked, alternating, `--rounds` rounds of `--steps` steps each way after one
warm-up step each way, so that drift hits both alike. Printed per (kind, docs): the mean number of
documents a row, the distinct document lengths of the batch (today's masking calls each layer once
per length), the median s/step of each way and their ratio, and the aten ops that ONE forward
dispatches (no_grad, counted with a TorchDispatchMode: machine-independent, so a change to the
masking is compared exactly), masked and unmasked.

`--launches` mode: the Triton kernel launches of one layer's forward + backward (an inference-only
kind, FS-B: its forward, with thresholds tau = 0; `--kinds fsb`)
(`model.n_layers=1`, `model.attention.impl=triton`, batch 1, fp32), run by Triton's interpreter on
the CPU (the script sets TRITON_INTERPRET=1 itself before it imports Triton), on a row of
`--launch-seq-len` tokens packed with each of `--launch-docs` documents (1: the whole row as one
document, still passed as `doc_ids`). The
documents' lengths are as distinct as the row allows (each distinct length is one more call of
the layer today): proportional to 1, 2, ..., n where n(n+1)/2 <= seq_len, else 1, 2, ..., k with
the rest of the documents one token long; their order is shuffled (`--seed`). A launch is a call
of a Triton kernel's `run` (the interpreter's `InterpretedFunction` or a compiled `JITFunction`),
other than a warm-up. Printed per kind: the launches at each document count, the largest count
over the 1-document count, and whether the count does not grow with the documents (the acceptance
"flat within 10%"): "yes" where every count is at most 110% of the 1-document count ("yes (fewer)"
where some is under 90%: shorter documents need fewer launches, e.g. AR-GRC's shallower trees, or
no long-range branch in documents within one query block), else "no (more)". A kind whose model
launches no kernel, or cannot be built or run with impl=triton on a 1-document row, is reported as
"no kernel".

`--json PATH` writes the rows of either mode as a list of dicts.
"""

from __future__ import annotations

import os
import sys

if "--launches" in sys.argv[1:]:  # triton.jit reads it when a kernel is decorated: before any import of Triton
    os.environ["TRITON_INTERPRET"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from aten_ops import count_aten_ops  # noqa: E402
from fsframework.config import load_config  # noqa: E402
from fsframework.config.kinds import KIND_FACTS  # noqa: E402
from fsframework.models.freesolo_attention import set_fsb_thresholds  # noqa: E402
from fsframework.models.registry import build_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "yamls" / "quickstart.yaml"
TRAINABLE = tuple(name for name, facts in KIND_FACTS.items() if facts.trainable)  # FS-B is a read path only
FLAT = 0.10  # the acceptance: launches flat within 10% of the 1-document count


# --- documents ---

def exponential_lengths(seq_len: int, docs: int, rng: random.Random) -> list[int]:
    """Document lengths filling a row of `seq_len` tokens: exponential with mean seq_len/docs, rounded,
    at least 1 token, the last one cut to fill the row exactly."""
    lengths, total = [], 0
    while total < seq_len:
        size = max(1, round(rng.expovariate(docs / seq_len)))
        size = min(size, seq_len - total)
        lengths.append(size)
        total += size
    return lengths


def distinct_lengths(seq_len: int, docs: int, rng: random.Random) -> list[int]:
    """`docs` document lengths filling `seq_len` tokens, as many of them distinct as fit: proportional to
    1..n where n(n+1)/2 <= seq_len (all distinct), else 1..k and the rest one token long (k distinct);
    shuffled."""
    if not 1 <= docs <= seq_len:
        raise ValueError(f"{docs} documents do not fit a row of {seq_len} tokens")
    whole = docs * (docs + 1) // 2
    if whole <= seq_len:
        lengths = [seq_len * i // whole for i in range(1, docs + 1)]  # steps of seq_len/whole >= 1: distinct
        lengths[-1] += seq_len - sum(lengths)
    else:  # the largest k with (docs - k) ones and 1..k fitting
        k = max(k for k in range(1, docs + 1) if docs - k + k * (k + 1) // 2 <= seq_len)
        lengths = [1] * (docs - k) + list(range(1, k))
        lengths.append(seq_len - sum(lengths))
    rng.shuffle(lengths)
    return lengths


def run_ids(rows: list[list[int]]) -> torch.Tensor:
    """`[B, T]` doc_ids of rows given as document lengths: each document's index in its row."""
    return torch.tensor([[d for d, size in enumerate(row) for _ in range(size)] for row in rows])


# --- counting ---

def aten_ops(model, tokens: torch.Tensor, doc_ids) -> int:
    """Aten ops dispatched by one forward of `tokens` (no_grad: inference mode would hide ops from a mode)."""
    with torch.no_grad():
        return count_aten_ops(model, tokens, doc_ids=doc_ids)


class Launches:
    """Counts Triton kernel launches (calls of a kernel's `run` that are not warm-ups), by kernel name,
    while active: wraps the interpreter's `InterpretedFunction.run` and the compiled `JITFunction.run`."""

    def __init__(self):
        self.counts: Counter = Counter()
        self._undo = []

    def __enter__(self):
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        for cls in (InterpretedFunction, JITFunction):
            original = cls.__dict__["run"]

            def run(fn_self, *args, _original=original, **kwargs):
                if not kwargs.get("warmup", False):
                    self.counts[getattr(fn_self, "__name__", "?")] += 1
                return _original(fn_self, *args, **kwargs)

            cls.run = run
            self._undo.append((cls, original))
        return self

    def __exit__(self, *exc):
        for cls, original in self._undo:
            cls.run = original
        self._undo.clear()
        return False

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# --- the model ---

def make_model(kind: str, seq_len: int, seed: int, overrides: list[str]):
    cfg = load_config(CONFIG, [f"data.seq_len={seq_len}", f"model.name={kind}", *overrides])
    torch.manual_seed(seed)
    return build_model(cfg.model), cfg.model.vocab_size


def train_step(model, tokens: torch.Tensor, doc_ids) -> float:
    """One forward with targets (per-token losses), the mean, backward; its wall time."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    loss = model(tokens[:, :-1], targets=tokens[:, 1:], doc_ids=doc_ids).mean()
    loss.backward()
    return time.perf_counter() - start


# --- step-time mode ---

def step_time_rows(args, kinds: list[str], docs_list: list[int]) -> list[dict]:
    layouts = {}
    for docs in docs_list:
        rng = random.Random(f"{args.seed}-{docs}")
        layouts[docs] = [exponential_lengths(args.seq_len, docs, rng) for _ in range(args.batch)]
    head = (f"{'kind':<11}{'docs':>6}{'docs/row':>10}{'lengths':>9}{'unmasked s/step':>17}{'masked s/step':>15}"
            f"{'masked/unmasked':>17}{'aten ops masked':>17}{'aten ops unmasked':>19}")
    print(f"quickstart model, {args.batch} rows x {args.seq_len} tokens, {args.rounds} rounds x {args.steps} steps "
          f"each way after 1 warm-up, {args.threads} thread(s); exponential document lengths (seed {args.seed})")
    print(head)
    print("-" * len(head), flush=True)
    rows = []
    for kind in kinds:
        model, vocab = make_model(kind, args.seq_len, args.seed, args.set)
        tokens = torch.randint(0, vocab, (args.batch, args.seq_len + 1),  # the same tokens for every kind
                               generator=torch.Generator().manual_seed(args.seed))
        for docs in docs_list:
            layout = layouts[docs]
            doc_ids = run_ids(layout)
            ways = {"unmasked": None, "masked": doc_ids}
            times: dict[str, list[float]] = {way: [] for way in ways}
            for way, ids in ways.items():
                train_step(model, tokens, ids)  # warm-up
            for _ in range(args.rounds):
                for way, ids in ways.items():
                    times[way] += [train_step(model, tokens, ids) for _ in range(args.steps)]
            model.zero_grad(set_to_none=True)
            unmasked, masked = (statistics.median(times[way]) for way in ways)
            row = {"kind": kind, "docs": docs, "docs_per_row": sum(map(len, layout)) / len(layout),
                   "distinct_lengths": len({size for r in layout for size in r}), "seq_len": args.seq_len,
                   "batch": args.batch, "unmasked_s": unmasked, "masked_s": masked, "ratio": masked / unmasked,
                   "aten_ops_masked": aten_ops(model, tokens[:, :-1], doc_ids),
                   "aten_ops_unmasked": aten_ops(model, tokens[:, :-1], None)}
            rows.append(row)
            print(f"{kind:<11}{docs:>6}{row['docs_per_row']:>10.1f}{row['distinct_lengths']:>9}{unmasked:>17.4f}"
                  f"{masked:>15.4f}{row['ratio']:>17.3f}{row['aten_ops_masked']:>17}{row['aten_ops_unmasked']:>19}",
                  flush=True)
        del model
    return rows


# --- launches mode ---

def launch_rows(args, kinds: list[str], docs_list: list[int]) -> list[dict]:
    layouts = {docs: distinct_lengths(args.launch_seq_len, docs, random.Random(f"{args.seed}-{docs}"))
               for docs in docs_list}
    base = docs_list[0]
    head = (f"{'kind':<11}" + "".join(f"{f'{d} docs':>10}" for d in docs_list) + f"{'max/' + str(base):>10}"
            + f"{'flat ±10%':>12}")
    print(f"Triton launches of one layer's forward + backward (model.attention.impl=triton, TRITON_INTERPRET=1, "
          f"fp32), 1 row x {args.launch_seq_len} tokens; distinct document lengths at "
          + ", ".join(f"{d} docs: {len(set(layouts[d]))}" for d in docs_list))
    print(head)
    print("-" * len(head), flush=True)
    rows = []
    for kind in kinds:
        row = {"kind": kind, "seq_len": args.launch_seq_len, "launches": {}, "kernels": {},
               "distinct_lengths": {str(d): len(set(layouts[d])) for d in docs_list}}
        try:
            model, vocab = make_model(kind, args.launch_seq_len, args.seed,
                                      ["model.n_layers=1", "model.attention.impl=triton", *args.set])
            model = model.float()
            if not KIND_FACTS[kind].trainable:  # FS-B: a forward; tau 0 (the launches do not depend on it)
                model.eval()
                set_fsb_thresholds(model, [[0.0] * model.cfg.n_heads] * model.cfg.n_layers, source="bench_documents")
            tokens = torch.randint(0, vocab, (1, args.launch_seq_len + 1),
                                   generator=torch.Generator().manual_seed(args.seed))
        except Exception as exc:  # a kind whose config or model refuses impl=triton
            model, row["error"] = None, f"{type(exc).__name__}: {exc}"
        for docs in docs_list if model is not None else []:
            doc_ids = run_ids([layouts[docs]])  # 1 document too: the masked path, on a whole row
            try:
                with Launches() as launches:
                    if KIND_FACTS[kind].trainable:
                        train_step(model, tokens, doc_ids)
                    else:
                        with torch.no_grad():
                            model(tokens[:, :-1], doc_ids=doc_ids)
            except Exception as exc:
                row["error"] = f"{docs} docs: {type(exc).__name__}: {exc}"
                print(f"  {kind} at {docs} documents failed: {row['error']}", file=sys.stderr, flush=True)
                if docs == base:
                    break
                row["launches"][str(docs)] = None
                continue
            row["launches"][str(docs)] = launches.total
            row["kernels"][str(docs)] = dict(launches.counts)
        counts = [row["launches"].get(str(d)) for d in docs_list]
        first = counts[0]
        if not first:  # no launch (or no model) at the whole row: the kind has no kernel on this path
            row.update(ratio=None, flat=None, verdict="no kernel")
            print(f"{kind:<11}" + f"{'no kernel':>{10 * len(docs_list)}}", flush=True)
        else:
            known = [c for c in counts if c is not None]
            row["ratio"] = max(known) / first
            row["flat"] = None if None in counts else all(c <= (1 + FLAT) * first for c in counts)
            row["verdict"] = ("error" if row["flat"] is None else "no (more)" if not row["flat"]
                              else "yes (fewer)" if min(known) < (1 - FLAT) * first else "yes")
            print(f"{kind:<11}" + "".join(f"{'error' if c is None else c:>10}" for c in counts)
                  + f"{row['ratio']:>10.2f}{row['verdict']:>12}", flush=True)
        rows.append(row)
    return rows


def _ints(text: str, flag: str, parser) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{flag} takes a comma list of integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{flag} takes a comma list of integers >= 1, got {text!r}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--launches", action="store_true",
                        help="count Triton kernel launches of one layer (TRITON_INTERPRET=1) instead of timing steps")
    parser.add_argument("--kinds", default=",".join(TRAINABLE),
                        help="comma list of model kinds (model.name), by default every trainable one "
                             "(--launches reports those without a kernel as 'no kernel')")
    parser.add_argument("--docs", default="8,64", help="step-time mode: comma list of mean documents a row")
    parser.add_argument("--seq-len", type=int, default=2048, help="step-time mode: tokens a row")
    parser.add_argument("--batch", type=int, default=2, help="step-time mode: rows a batch")
    parser.add_argument("--steps", type=int, default=2, help="step-time mode: timed steps per round and way")
    parser.add_argument("--rounds", type=int, default=3,
                        help="step-time mode: rounds, each running --steps unmasked then --steps masked")
    parser.add_argument("--launch-seq-len", type=int, default=256, help="--launches: tokens of the one row")
    parser.add_argument("--launch-docs", default="1,8,64",
                        help="--launches: comma list of documents in the row, the first the baseline (1: whole row)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, tokens and document lengths")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of the model (yamls/quickstart.yaml), e.g. model.n_heads=2; repeatable")
    # one thread by default: timings on a shared machine are stable only when no thread waits for a core
    parser.add_argument("--threads", type=int, default=1, help="torch threads (torch.set_num_threads)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the rows to this JSON file (a list)")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KIND_FACTS]
    if unknown or not kinds:
        parser.error(f"--kinds: unknown kind(s) {unknown}; choose from {', '.join(KIND_FACTS)}")
    read_only = [k for k in kinds if not KIND_FACTS[k].trainable]
    if read_only and not args.launches:
        parser.error(f"--kinds: {', '.join(read_only)} is inference-only (no training step): use "
                     + ", ".join(KIND_FACTS[k].trained_as for k in read_only))
    if min(args.seq_len, args.batch, args.steps, args.rounds, args.launch_seq_len, args.threads) < 1:
        parser.error("--seq-len, --batch, --steps, --rounds, --launch-seq-len and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    if args.launches:
        docs = _ints(args.launch_docs, "--launch-docs", parser)
        if max(docs) > args.launch_seq_len:
            parser.error(f"--launch-docs: {max(docs)} documents do not fit {args.launch_seq_len} tokens")
        rows = launch_rows(args, kinds, docs)
    else:
        docs = _ints(args.docs, "--docs", parser)
        if max(docs) > args.seq_len:
            parser.error(f"--docs: {max(docs)} documents a row do not fit {args.seq_len} tokens")
        rows = step_time_rows(args, kinds, docs)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
