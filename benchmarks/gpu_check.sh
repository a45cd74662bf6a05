#!/usr/bin/env bash
# The GPU measurements of issue 32 in one prepared run (docs/benchmarks.md, "GPU" sections).
# STEPS picks and orders them (default: all five):
#   update      the s2t_transformer_s update at the thesis's 320k-frame batch in bf16: time,
#               model-FLOP utilisation, a profiler trace and the optimised HLO (~2 min)
#   attention   the attention table in bf16 against cuDNN flash attention (~2 min)
#   variants    the same update timed as is, and without attention dropout: our softmax, then
#               cuDNN's fused attention (~4 min)
#   encoder     the encoder's evaluation forward, our softmax against cuDNN: time and the
#               largest difference of the outputs (~1 min)
#   layer_norm  the update as is, without XLA's cuDNN layer-norm rewrite, which the toolkit
#               turns on where JAX's CUDA plugin is (runtime/xla_flags.py; ~1.5 min)
#   flash       attention with dropout, fwd+bwd: our Pallas kernel against the dense softmax
#               (outputs and gradients compared, same masks) and cuDNN without dropout (~1 min)
#   flash_update  the update with attention dropout through the dense softmax ('xla') and
#               through our Pallas kernel ('flash', what 'auto' picks; ~3 min)
#   loader      the input pipeline on a synthetic MuST-C-like corpus of $LOADER_GB GB (default
#               20) written on that host: frames/s at 4, 8 and every core's workers (~3 min)
#   end_to_end  s2t_transformer_s and s2t_v2 trained by run.py on that corpus for $UPDATES
#               (default 120) updates of 320k frames: s/update against the isolated update,
#               data wait, compile count and time (~6 min on a cold compilation cache)
# Writes into $OUT (default /tmp/gpu_check); ml_collections is installed from .whl/ when the
# machine lacks it.
#
#     STEPS="variants encoder" bash benchmarks/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
STEPS=${STEPS:-"update attention variants encoder layer_norm flash flash_update"}
CORPUS=${CORPUS:-/tmp/mustc_like}
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
python3 -c "from multiformer_jax.runtime import xla_flags as x; print('cuda plugin found:', x.cuda_plugin_installed(), '| XLA_FLAGS:', x.add_default_xla_flags())"
# BATCH, FRAMES and LENGTHS make a small dry run of the same script on a CPU.
STEP="--dtype bfloat16 --batch ${BATCH:-320} --frames ${FRAMES:-1000} --tokens 50 --steps 5 \
      --peak_size 8192 --memory_configs="
# The variants' model FLOPs: those of the 320 x 1000 update, counted on a CPU
# (docs/benchmarks/gpu/2026-11-26), or counted again for another BATCH or FRAMES.
if [ -z "${BATCH:-}${FRAMES:-}" ]; then FLOPS="--flops ${MODEL_FLOPS:-10.74e12}"; else FLOPS=""; fi
S=s2t_transformer_s

update() {
  echo "== update: $S, batch 320 x 1000 frames, trace and HLO"
  python3 -m benchmarks.train_step --out "$OUT/train_step.jsonl" $STEP --configs $S \
      --trace_dir /tmp/trace
  python3 -m benchmarks.trace_summary /tmp/trace 60 > "$OUT/trace_top.txt"
  cp /tmp/trace/$S.hlo.txt.gz "$OUT/"
  find /tmp/trace -name perfetto_trace.json.gz -exec cp {} "$OUT/" \;
}

attention() {
  echo "== attention, bf16, fwd+bwd, batch 8, 4 x 64, against cuDNN"
  python3 -m benchmarks.attention --out "$OUT/attention.jsonl" --dtype bfloat16 \
      --lengths "${LENGTHS:-1024,4096,8192}" --max_dense_n 8192 \
      --only "full,cudnn_full,dense_masked(129),cudnn_masked(129),local(129),kernel(256),full/blockwise(512)"
}

variants() {
  echo "== variants: as is; no attention dropout, our softmax; the same through cuDNN"
  local no_dropout="$S@attention_dropout=0.0;attention_implementation"
  python3 -m benchmarks.train_step --out "$OUT/train_step_variants.jsonl" $STEP \
      $FLOPS --configs "$S,$no_dropout=xla,$no_dropout=cudnn"
}

layer_norm() {
  echo "== layer_norm: as is, without XLA's cuDNN layer-norm rewrite"
  XLA_FLAGS="--xla_gpu_enable_cudnn_layer_norm=false" python3 -m benchmarks.train_step \
      --out "$OUT/train_step_no_cudnn_layer_norm.jsonl" $STEP $FLOPS --configs $S
}

encoder() {
  echo "== encoder: evaluation forward, batch 64 x 1000 frames (down to 500), xla vs cudnn"
  python3 -m benchmarks.encoder_eval --out "$OUT/encoder_eval.jsonl" --dtype bfloat16 \
      --batch ${EVAL_BATCH:-64} --frames ${FRAMES:-1000} --implementations xla,cudnn
}

flash() {
  echo "== flash: attention with dropout 0.1, fwd+bwd, Pallas kernel vs dense vs cuDNN (no dropout)"
  python3 -m benchmarks.flash_dropout --out "$OUT/flash_dropout.jsonl" \
      --shapes "${FLASH_SHAPES:-320x250,8x1024,8x4096}"
}

flash_update() {
  echo "== flash_update: attention dropout through the dense softmax, then the Pallas kernel"
  python3 -m benchmarks.train_step --out "$OUT/train_step_flash.jsonl" $STEP $FLOPS \
      --configs "$S@attention_implementation=xla,$S@attention_implementation=flash"
}

loader() {
  echo "== loader: ${LOADER_GB:-20} GB of MuST-C-like features, 320k-frame batches"
  local all=$(( $(nproc) - 1 ))
  python3 -m benchmarks.input_pipeline --gb "${LOADER_GB:-20}" --corpus_dir "$CORPUS" --keep \
      --reuse --workers "${LOADER_WORKERS:-0,4,8,$all}" --batches "${LOADER_BATCHES:-40}" \
      --out "$OUT/input_pipeline.jsonl"
}

end_to_end() {
  echo "== end_to_end: run.py on the synthetic corpus, ${UPDATES:-120} updates of 320k frames"
  python3 -m benchmarks.end_to_end --configs "${E2E_CONFIGS:-s2t_transformer_s,s2t_v2}" \
      --updates "${UPDATES:-120}" --gb "${LOADER_GB:-20}" --corpus_dir "$CORPUS" --isolated \
      --out "$OUT/end_to_end.jsonl" ${E2E_FLAGS:-}
}

for step in $STEPS; do
  $step
  date -u
done
