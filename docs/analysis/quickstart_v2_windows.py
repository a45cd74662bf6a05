"""Efficient model chosen by window selection (Alastruey et al. 2022, Algorithm 1).

Generated 2026-11-22 by
  python -m multiformer_jax.analyze windows --workdir runs/quickstart_600 --stage st --num_utterances 400 --out docs/analysis --no_progress
from quickstart_v2, st best (step 300), 77 utterances of dev.

  layer  1: mu   1.00 +-  0.00  w   1  CL 0.024 +- 0.006  -> local(1)
  layer  2: mu   1.00 +-  0.00  w   1  CL 0.020 +- 0.004  -> local(1)
  layer  3: mu   1.00 +-  0.00  w   1  CL 0.019 +- 0.004  -> local(1)
  layer  4: mu   1.00 +-  0.00  w   1  CL 0.019 +- 0.004  -> local(1)
  layer  5: mu   1.00 +-  0.00  w   1  CL 0.018 +- 0.004  -> local(1)
  layer  6: mu   1.00 +-  0.00  w   1  CL 0.019 +- 0.004  -> local(1)

Layout: 6x(4*local(1))

Run:  python run.py --config=docs/analysis/quickstart_v2_windows.py --workdir=runs/quickstart_v2_windows
"""

import json

import ml_collections

ANALYSED_CONFIG = json.loads("{\n \"name\": \"quickstart_v2\",\n \"reported\": {\n  \"bleu\": -1.0,\n  \"wer\": -1.0,\n  \"source\": \"\"\n },\n \"model\": {\n  \"vocab_size\": 8000,\n  \"input_dim\": 80,\n  \"d_model\": 128,\n  \"ffn_dim\": 512,\n  \"encoder_layers\": 6,\n  \"decoder_layers\": 2,\n  \"encoder_heads\": 4,\n  \"decoder_heads\": 4,\n  \"encoder_layout\": \"3x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2))\",\n  \"conv_kernels\": [\n   5,\n   5\n  ],\n  \"conv_strides\": [\n   2,\n   2\n  ],\n  \"conv_channels\": 256,\n  \"dropout\": 0.1,\n  \"attention_dropout\": 0.1,\n  \"activation_dropout\": 0.1,\n  \"kernel_redraw\": \"fixed\",\n  \"kernel_seed\": 0,\n  \"local_block_size\": 0,\n  \"qkv_bias\": false,\n  \"dtype\": \"float32\",\n  \"max_target_positions\": 1024,\n  \"bos_id\": 0,\n  \"pad_id\": 1,\n  \"eos_id\": 2,\n  \"unk_id\": 3\n },\n \"data\": {\n  \"prepared_dir\": \"data/prepared/embedded_en_de\",\n  \"corpus\": \"mustc\",\n  \"root\": \"data/embedded\",\n  \"pairs\": \"en-de\",\n  \"embedded\": true,\n  \"embedded_sources\": \"en\",\n  \"embedded_target\": \"de\",\n  \"asr_vocab\": 500,\n  \"st_vocab\": 500,\n  \"train_split\": \"train\",\n  \"dev_split\": \"dev\",\n  \"test_split\": \"tst-COMMON\",\n  \"max_frames\": 16000,\n  \"num_buckets\": 4,\n  \"max_source_frames\": 3000,\n  \"cmvn\": \"utterance\",\n  \"specaugment\": true,\n  \"seed\": 1\n },\n \"train\": {\n  \"stages\": [\n   \"asr\",\n   \"st\"\n  ],\n  \"parallel\": \"pmap\",\n  \"seed\": 1,\n  \"log_every\": 10,\n  \"adam_b1\": 0.9,\n  \"adam_b2\": 0.999,\n  \"adam_eps\": 1e-08,\n  \"clip_norm\": 10.0,\n  \"label_smoothing\": 0.1,\n  \"max_consecutive_nonfinite\": 10,\n  \"compilation_cache\": \"~/.cache/multiformer_jax/jax\"\n },\n \"asr\": {\n  \"lr\": 0.002,\n  \"warmup_updates\": 60,\n  \"max_updates\": 600,\n  \"update_freq\": 1,\n  \"eval_every\": 100,\n  \"keep_last\": 4\n },\n \"st\": {\n  \"lr\": 0.002,\n  \"warmup_updates\": 60,\n  \"max_updates\": 600,\n  \"update_freq\": 1,\n  \"eval_every\": 100,\n  \"keep_last\": 4,\n  \"encoder_init\": \"best\",\n  \"encoder_init_average\": 10\n },\n \"eval\": {\n  \"checkpoint\": \"average\",\n  \"average_last\": 3,\n  \"beam\": 5,\n  \"length_penalty\": 1.0,\n  \"max_len_a\": 0.0,\n  \"max_len_b\": 60,\n  \"batch_frames\": 20000,\n  \"num_buckets\": 1,\n  \"after_training\": true\n }\n}")
ENCODER_LAYOUT = '6x(4*local(1))'


def get_config():
  config = ml_collections.ConfigDict(ANALYSED_CONFIG)
  config.name = 'quickstart_v2_windows'
  config.model.encoder_layout = ENCODER_LAYOUT
  config.reported = ml_collections.ConfigDict({"bleu": None, "wer": None, "source": ""})
  return config
