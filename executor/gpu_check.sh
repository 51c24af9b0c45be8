#!/usr/bin/env bash
# GPU check: calibration (GEMM rate and memory bandwidth timed on the GPU, collectives on
# 2 gloo ranks), one validation of a 1-rank plan with NCCL on a single GPU, printing
# predicted vs measured, and the same plan under torchrun (meshplan.executor.run). Usage: executor/gpu_check.sh [OUTDIR]   (needs one CUDA GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-${OUT:-/tmp/meshplan-gpu}}
mkdir -p "$OUT"
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible')"
"$PY" -m meshplan calibrate --nproc 2 --quick --device cuda --output "$OUT/gpu-local.yaml"
cat > "$OUT/llama.json" <<'JSON'
{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
 "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 32000,
 "max_position_embeddings": 1024}
JSON
"$PY" - "$OUT" <<'PYEOF'
import sys
from meshplan.plan import Plan
from meshplan.strategy import Strategy
out = sys.argv[1]
Plan(f"{out}/llama.json", f"{out}/gpu-local.yaml",
     Strategy(micro_batch_size=4, global_batch_size=8, dtype="bfloat16", optimizer="adamw"),
     seq_len=1024).save(f"{out}/plan.json")
PYEOF
"$PY" -m meshplan validate "$OUT/plan.json" --nproc 1 --backend nccl --steps 5 \
    --cluster "$OUT/gpu-local.yaml" --csv "$OUT/validation.csv"
"$PY" -m meshplan validate "$OUT/plan.json" --nproc 1 --backend nccl --steps 5 \
    --cluster "$OUT/gpu-local.yaml" --csv "$OUT/validation.csv" --json > "$OUT/validate.json"
# the same plan under torchrun (one node, one process; NCCL), rank 0 appends the same CSV row
"$PY" -m torch.distributed.run --nnodes 1 --nproc-per-node 1 -m meshplan.executor.run \
    "$OUT/plan.json" --steps 5 --cluster "$OUT/gpu-local.yaml" --csv "$OUT/validation.csv" \
    --json > "$OUT/torchrun.json"
echo "gpu check done: $OUT"
