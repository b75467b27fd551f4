"""A corpus of long documents that every machine with this Python has: the standard library's
modules, one document a file (experiments/README.md, "Documents").

The embedded corpus holds few held-out documents longer than 2048 bytes, too few to read a model at
4x-8x a 512-token training length. The standard library's `.py` files are documents of 1-64 KB in a
fixed order, so `fsf data build` of them holds out enough long ones, the same ones on every machine
with the same Python version.

    .venv/bin/python experiments/stdlib_corpus.py --out runs/stdlib.jsonl
    .venv/bin/fsf data build runs/stdlib.jsonl --out runs/stdlib-shards --seq-len 512 --eval-fraction 0.05
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path


def stdlib_documents(max_bytes: int) -> list[tuple[str, str]]:
    """(relative path, text) of the standard library's `.py` files of at most `max_bytes`, in path order
    (site-packages left out: what is installed differs between machines)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or path.stat().st_size > max_bytes:
            continue
        try:
            docs.append((str(path.relative_to(root)), path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:  # a few test fixtures are deliberately not UTF-8
            continue
    return docs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the JSON-lines file to write ({'text': ...} a line)")
    parser.add_argument("--max-bytes", type=int, default=65536, help="leave out larger files")
    args = parser.parse_args(argv)
    docs = stdlib_documents(args.max_bytes)
    with open(args.out, "w") as f:
        for _, text in docs:
            f.write(json.dumps({"text": text}) + "\n")
    total = sum(len(t.encode()) for _, t in docs)
    print(f"{len(docs)} documents, {total / 1e6:.1f} MB, Python {sys.version.split()[0]} -> {args.out}")


if __name__ == "__main__":
    main()
