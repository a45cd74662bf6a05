#!/usr/bin/env bash
# The GPU measurements of issue 32 in one prepared run (docs/benchmarks.md, "GPU" sections):
# the s2t_transformer_s update at the thesis's 320k-frame batch in bf16 (time, model-FLOP
# utilisation, a profiler trace and the optimised HLO), the attention table in bf16 against
# cuDNN flash attention, then the update without attention dropout (7 files in
# all; about 7 minutes on an H200). Writes into $OUT (default
# /tmp/gpu_check); ml_collections is installed from .whl/ when the machine lacks it.
#
#     bash benchmarks/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! python3 -c "import ml_collections" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
exec > >(tee "$OUT/log.txt") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
# BATCH, FRAMES and LENGTHS make a small dry run of the same script on a CPU.
STEP="--dtype bfloat16 --batch ${BATCH:-320} --frames ${FRAMES:-1000} --tokens 50 --steps 5 \
      --peak_size 8192 --memory_configs="
echo "== 1. s2t_transformer_s update, batch 320 x 1000 frames, trace and HLO"
python3 benchmarks/train_step.py --out "$OUT/train_step.jsonl" $STEP \
    --configs s2t_transformer_s --trace_dir /tmp/trace
python3 benchmarks/trace_summary.py /tmp/trace 60 > "$OUT/trace_top.txt"
cp /tmp/trace/s2t_transformer_s.hlo.txt.gz "$OUT/"
find /tmp/trace -name perfetto_trace.json.gz -exec cp {} "$OUT/" \;
echo "== 2. attention, bf16, fwd+bwd, batch 8, 4 x 64, against cuDNN"
python3 benchmarks/attention.py --out "$OUT/attention.jsonl" --dtype bfloat16 \
    --lengths "${LENGTHS:-1024,4096,8192}" --max_dense_n 8192 \
    --only "full,cudnn_full,dense_masked(129),cudnn_masked(129),local(129),kernel(256),full/blockwise(512)"
echo "== 3. the update without attention dropout (what cuDNN's fused attention could replace)"
python3 benchmarks/train_step.py --out "$OUT/train_step_no_attention_dropout.jsonl" $STEP \
    --configs "s2t_transformer_s@attention_dropout=0.0"
date -u
