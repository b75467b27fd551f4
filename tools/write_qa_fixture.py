"""Write small QA files in the official SQuAD v2.0 / HotpotQA formats (`dev-v2.0.json`,
`hotpot_dev_distractor_v1.json`) into DIR, for a first run of RULER's qa_1 / qa_2 without the
official files: `fsf eval RUN --tasks ruler --ruler-data DIR`. Their questions are cloze
questions about standard-library documentation: they check the pipeline, not a model's reading
(docs/evaluation.md §4.1 says where to get the official files).

    python tools/write_qa_fixture.py DIR [--seed N] [--force]
"""

from __future__ import annotations

import argparse

from fsframework.eval.qa_fixture import write_qa_fixture
from fsframework.eval.ruler_qa import load_qa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="write over QA files already in the folder")
    args = parser.parse_args()
    try:
        paths = write_qa_fixture(args.out_dir, args.seed, replace=args.force)
    except (FileExistsError, NotADirectoryError) as exc:
        raise SystemExit(f"error: {exc}") from None
    for task, path in paths.items():
        data = load_qa(task, args.out_dir)
        print(f"{task}: {path} ({len(data.questions)} questions, {len(data.documents)} documents)")


if __name__ == "__main__":
    main()
