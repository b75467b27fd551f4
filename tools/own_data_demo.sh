#!/usr/bin/env bash
# One's own data, logs and tools, end to end on the CPU (a few minutes): build shards from a
# jsonl and a parquet file with a held-out split, train an FS model 20 steps on them with
# validation every 5, evaluate its perplexity, calibrate FS-B, export it, and run
# lm-evaluation-harness on the export with a task of one's own (a YAML over a local jsonl).
# Every step must exit 0. Usage: bash tools/own_data_demo.sh [WORK_DIR]  (default: a new temporary
# directory). PYTHON names the interpreter (default: .venv/bin/python, set up by tools/setup.sh,
# with the dev extras for pyarrow and lm-eval).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WORK=$(realpath -m "${1:-$(mktemp -d)}")
mkdir -p "$WORK"
fsf() { "$PY" -m fsframework "$@"; }

# documents: the standard library's Python sources, cut into 2,000-character pieces
"$PY" - "$WORK" <<'EOF'
import json, pathlib, sys
import pyarrow as pa, pyarrow.parquet as pq

work = pathlib.Path(sys.argv[1])
sources = sorted(pathlib.Path(json.__file__).parent.parent.glob("*.py"))[:60]
docs = [text[i:i + 2000] for p in sources for text in [p.read_text(errors="replace")] for i in range(0, len(text), 2000)]
half = len(docs) // 2
(work / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:half]))
pq.write_table(pa.table({"text": docs[half:]}), work / "docs.parquet")
print(f"{len(docs)} documents: {half} in docs.jsonl, {len(docs) - half} in docs.parquet")
EOF

fsf data build "$WORK/docs.jsonl" "$WORK/docs.parquet" --out "$WORK/shards" --seq-len 256 --eval-fraction 0.1
fsf train yamls/quickstart.yaml run_dir="$WORK/run" data.source=shards data.path="$WORK/shards" data.seq_len=256 \
    data.micro_batch_size=4 model.d_model=64 model.n_layers=2 model.n_heads=2 train.max_steps=20 \
    train.eval_every=5 train.eval_batches=2 train.ckpt_every=10 train.log_every=5 optim.warmup_steps=5 \
    "eval.lengths=[256,512]"
fsf eval "$WORK/run" --tasks perplexity --lengths 256,512 --num-samples 2
fsf calibrate "$WORK/run" --windows 8 --seq-len 512  # the defaults: up to 64 windows of 4096 tokens
fsf export "$WORK/run" "$WORK/export"

mkdir -p "$WORK/tasks"
printf '%s\n' '{"question": "def main(", "choices": ["):", "]]"], "label": 0}' \
    '{"question": "import ", "choices": ["os", "\u00e9\u00e9"], "label": 0}' > "$WORK/tasks/local.jsonl"
cat > "$WORK/tasks/own_choice.yaml" <<EOF
task: own_choice
dataset_path: json
dataset_kwargs: {data_files: {test: $WORK/tasks/local.jsonl}}
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list: [{metric: acc}]
EOF
HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$PY" -m lm_eval --model hf \
    --model_args "pretrained=$WORK/export,trust_remote_code=True,dtype=float32" --tasks own_choice \
    --include_path "$WORK/tasks" --device cpu --batch_size 1 --output_path "$WORK/lm_eval"
echo "own-data demo: every step exited 0 (files in $WORK)"
