#!/usr/bin/env bash
# Prepared GPU check for the LLM side (one GPU; budget <= 10 minutes wall, each section under its own timeout).
#   1. GRPO on CUDA with bf16 autocast: a 4-step sync run of a mid-size tiny model (hidden 512,
#      8 layers) — checks device placement, autocast, the objective through the bridge on a CUDA
#      tensor (JAX on the host unless it has the GPU) and a checkpoint.
#   2. benchmarks/async_throughput.py on the GPU: sync vs AReaL (async, η=2) vs PipelineRL
#      (in-flight updates), same model / task / batch: completions/s, time to target, staleness.
#      Generation and training overlap on one GPU here (the CPU numbers in the README cannot show it).
# Needs a Python with a CUDA build of torch (the CPU venv from `make setup` will not see the GPU):
#   PY=/path/to/python bash benchmarks/gpu_llm.sh
# CPU smoke (tiny sizes, checks the code runs): GPU_LLM_DRY=1 bash benchmarks/gpu_llm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} HF_HUB_OFFLINE=1
DRY=${GPU_LLM_DRY:-0}
OUT=${GPU_LLM_OUT:-runs/gpu_llm}
mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
if [ "$DRY" = 1 ]; then
  DEV=cpu; BF16=""; SIZE="hidden_size=32 num_layers=2 num_heads=2"; STEPS=2; BENCH_STEPS=4
  BENCH_ARGS="--hidden-size 32 --num-layers 2 --num-heads 2 --prompts 4"
else
  DEV=cuda; BF16="bf16=true"; SIZE="hidden_size=512 num_layers=8 num_heads=8"; STEPS=4; BENCH_STEPS=24
  BENCH_ARGS="--device cuda --bf16 --hidden-size 512 --num-layers 8 --num-heads 8 --prompts 64"
fi

echo "== 1. GRPO on $DEV (bf16 autocast: ${BF16:-off}) =="
rm -rf "$OUT/grpo"
timeout 150 "$PY" -m scaling_rl.cli grpo --out "$OUT/grpo" --quiet device=$DEV $BF16 $SIZE \
  sft_steps=20 steps=$STEPS prompts_per_step=16 group_size=8 eval_problems=32 eval_every=$STEPS \
  checkpoint_every=$STEPS torch_threads=4 || echo "section 1 failed or timed out (rc=$?)"

echo "== 2. async / pipelined vs sync throughput on $DEV =="
timeout 400 "$PY" benchmarks/async_throughput.py --steps $BENCH_STEPS $BENCH_ARGS \
  --out "$OUT/async_throughput.json" || echo "section 2 failed or timed out (rc=$?)"
echo "done"
