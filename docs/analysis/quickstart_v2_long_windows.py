"""Efficient model chosen by window selection (Alastruey et al. 2022, Algorithm 1).

Generated 2026-11-26 by
  python -m multiformer_jax.analyze windows --workdir runs/quickstart_long --stage st --num_utterances 300 --out docs/analysis
from quickstart_v2_long, st best (step 6000), 300 utterances of dev.

  layer  1: mu   9.47 +-  1.96  w  13  CL 0.046 +- 0.024  -> local(13)
  layer  2: mu   6.35 +-  1.66  w   9  CL 0.051 +- 0.019  -> local(9)
  layer  3: mu   1.15 +-  1.37  w   3  CL 0.083 +- 0.015  -> local(3)
  layer  4: mu   1.09 +-  1.09  w   3  CL 0.073 +- 0.014  -> local(3)
  layer  5: mu   9.09 +-  0.72  w  11  CL 0.042 +- 0.024  -> local(11)
  layer  6: mu  10.14 +- 14.53  w  25  CL 0.077 +- 0.043  -> local(25)

Layout: 1x(4*local(13)) 1x(4*local(9)) 2x(4*local(3)) 1x(4*local(11)) 1x(4*local(25))

Run:  python run.py --config=docs/analysis/quickstart_v2_long_windows.py --workdir=runs/quickstart_v2_long_windows
"""

import json

import ml_collections

ANALYSED_CONFIG = json.loads("{\n \"name\": \"quickstart_v2_long\",\n \"reported\": {\n  \"bleu\": -1.0,\n  \"wer\": -1.0,\n  \"source\": \"\",\n  \"averages\": \"\"\n },\n \"model\": {\n  \"vocab_size\": 8000,\n  \"input_dim\": 80,\n  \"d_model\": 128,\n  \"ffn_dim\": 512,\n  \"encoder_layers\": 6,\n  \"decoder_layers\": 2,\n  \"encoder_heads\": 4,\n  \"decoder_heads\": 4,\n  \"encoder_layout\": \"3x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2))\",\n  \"conv_kernels\": [\n   5,\n   5,\n   5\n  ],\n  \"conv_strides\": [\n   2,\n   2,\n   2\n  ],\n  \"conv_channels\": 256,\n  \"dropout\": 0.0,\n  \"attention_dropout\": 0.0,\n  \"activation_dropout\": 0.0,\n  \"kernel_redraw\": \"fixed\",\n  \"kernel_seed\": 0,\n  \"local_block_size\": 0,\n  \"key_block_size\": -1,\n  \"ffn_token_chunk\": -1,\n  \"attention_implementation\": \"auto\",\n  \"qkv_bias\": false,\n  \"dtype\": \"float32\",\n  \"max_target_positions\": 1024,\n  \"task_tag\": \"\",\n  \"encoder_task_tag\": \"\",\n  \"decoder_task_tag\": \"\",\n  \"num_tasks\": 1,\n  \"encoder_num_tasks\": 0,\n  \"decoder_num_tasks\": 0,\n  \"encoder_candidates\": 0,\n  \"decoder_candidates\": 0,\n  \"selection_strategy\": \"group\",\n  \"selection_temperature\": 5.0,\n  \"selection_inference\": \"deterministic\",\n  \"adapter_dim\": 0,\n  \"bos_id\": 0,\n  \"pad_id\": 1,\n  \"eos_id\": 2,\n  \"unk_id\": 3\n },\n \"data\": {\n  \"prepared_dir\": \"data/prepared/embedded_ding_en_de\",\n  \"corpus\": \"mustc\",\n  \"root\": \"data/embedded_ding\",\n  \"pairs\": \"en-de\",\n  \"eval_only_pairs\": \"\",\n  \"embedded\": true,\n  \"embedded_sources\": \"en\",\n  \"embedded_target\": \"de\",\n  \"embedded_text\": \"catalogs,ding\",\n  \"embedded_speakers_per_sentence\": 1,\n  \"embedded_speakers_per_variant\": 1,\n  \"embedded_extra_training_variants\": false,\n  \"embedded_max_heldout\": 300,\n  \"target_lang_tag\": false,\n  \"asr_vocab\": 300,\n  \"st_vocab\": 1000,\n  \"train_split\": \"train\",\n  \"dev_split\": \"dev\",\n  \"test_split\": \"tst-COMMON\",\n  \"max_frames\": 6000,\n  \"num_buckets\": 4,\n  \"max_source_frames\": 3000,\n  \"cmvn\": \"utterance\",\n  \"specaugment\": true,\n  \"specaugment_policy\": \"sm\",\n  \"loader_workers\": -1,\n  \"prefetch_batches\": 4,\n  \"seed\": 1\n },\n \"train\": {\n  \"stages\": [\n   \"asr\",\n   \"st\"\n  ],\n  \"parallel\": \"pmap\",\n  \"seed\": 1,\n  \"log_every\": 10,\n  \"adam_b1\": 0.9,\n  \"adam_b2\": 0.98,\n  \"adam_eps\": 1e-08,\n  \"clip_norm\": 10.0,\n  \"label_smoothing\": 0.1,\n  \"max_consecutive_nonfinite\": 10,\n  \"early_stop_patience\": 0,\n  \"kl_weight\": 0.0,\n  \"selection_temperature_decay\": 0.0,\n  \"selection_temperature_min\": 0.5,\n  \"selection_lr_multiplier\": 1.0,\n  \"compilation_cache\": \"~/.cache/multiformer_jax/jax\"\n },\n \"asr\": {\n  \"lr\": 0.004,\n  \"lr_scheduler\": \"polynomial_decay\",\n  \"warmup_updates\": 100,\n  \"max_updates\": 30000,\n  \"update_freq\": 1,\n  \"pairs\": \"\",\n  \"ctc_weight\": 0.5,\n  \"eval_every\": 2000,\n  \"keep_last\": 4,\n  \"init_from\": \"\",\n  \"init_from_checkpoint\": \"latest\",\n  \"init_from_average\": 10,\n  \"train_only\": \"\"\n },\n \"st\": {\n  \"lr\": 0.003,\n  \"lr_scheduler\": \"polynomial_decay\",\n  \"warmup_updates\": 100,\n  \"max_updates\": 6000,\n  \"update_freq\": 1,\n  \"pairs\": \"\",\n  \"ctc_weight\": 0.0,\n  \"eval_every\": 2000,\n  \"keep_last\": 4,\n  \"init_from\": \"\",\n  \"init_from_checkpoint\": \"latest\",\n  \"init_from_average\": 10,\n  \"train_only\": \"\",\n  \"encoder_init\": \"best\",\n  \"encoder_init_average\": 10,\n  \"carry_decoder_layers\": false\n },\n \"eval\": {\n  \"checkpoint\": \"best\",\n  \"average_last\": 10,\n  \"average_around_best\": 7,\n  \"beam\": 5,\n  \"length_penalty\": 1.0,\n  \"max_len_a\": 0.0,\n  \"max_len_b\": 60,\n  \"min_len\": 1,\n  \"unk_penalty\": 0.0,\n  \"ctc_weight\": 0.2,\n  \"batch_frames\": 20000,\n  \"num_buckets\": 1,\n  \"after_training\": true,\n  \"score_dev\": true,\n  \"score_dev_beam\": 5\n }\n}")
ENCODER_LAYOUT = '1x(4*local(13)) 1x(4*local(9)) 2x(4*local(3)) 1x(4*local(11)) 1x(4*local(25))'


def get_config():
  config = ml_collections.ConfigDict(ANALYSED_CONFIG)
  config.name = 'quickstart_v2_long_windows'
  config.model.encoder_layout = ENCODER_LAYOUT
  config.reported = ml_collections.ConfigDict({"bleu": None, "wer": None, "source": ""})
  return config
