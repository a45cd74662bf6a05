"""Efficient model chosen by window selection (Alastruey et al. 2022, Algorithm 1).

Generated 2026-11-29 by
  python -m multiformer_jax.analyze windows --workdir runs/quickstart --stage st --num_utterances 300 --out runs/quickstart/analysis --no_progress --checkpoint latest
from quickstart_v2, st latest (step 4300), 300 utterances of dev.

  layer  1: mu   2.62 +-  3.20  w   7  CL 0.217 +- 0.034  -> local(7)
  layer  2: mu   7.01 +-  0.12  w   9  CL 0.134 +- 0.028  -> local(9)
  layer  3: mu   3.33 +-  3.17  w   7  CL 0.245 +- 0.028  -> local(7)
  layer  4: mu   2.84 +-  7.12  w  11  CL 0.216 +- 0.026  -> local(11)
  layer  5: mu   2.63 +-  4.65  w   9  CL 0.200 +- 0.022  -> local(9)
  layer  6: mu  10.78 +-  0.63  w  13  CL 0.115 +- 0.019  -> local(13)

Layout: 1x(4*local(7)) 1x(4*local(9)) 1x(4*local(7)) 1x(4*local(11)) 1x(4*local(9)) 1x(4*local(13))

Run:  python run.py --config=docs/analysis/quickstart_v2_windows.py --workdir=runs/quickstart_v2_windows
      (a copy of the file the command wrote into runs/quickstart/analysis/)
"""

import json

import ml_collections

ANALYSED_CONFIG = json.loads("{\n \"asr\": {\n  \"ctc_weight\": 0.5,\n  \"eval_every\": 1000,\n  \"frozen\": \"\",\n  \"init_from\": \"\",\n  \"init_from_checkpoint\": \"latest\",\n  \"keep_last\": 4,\n  \"lr\": 0.004,\n  \"lr_scheduler\": \"polynomial_decay\",\n  \"max_updates\": 7500,\n  \"pairs\": \"\",\n  \"train_only\": \"\",\n  \"update_freq\": 1,\n  \"warmup_updates\": 100\n },\n \"data\": {\n  \"asr_vocab\": 300,\n  \"cmvn\": \"utterance\",\n  \"corpus\": \"embedded\",\n  \"dev_split\": \"dev\",\n  \"embedded\": {\n   \"bible_english\": \"web\",\n   \"bible_max_words\": 20,\n   \"max_heldout\": 300,\n   \"other_synthesizer_share\": 0.5,\n   \"seed\": 1,\n   \"sources\": \"en\",\n   \"synthesizers\": \"espeak,flite\",\n   \"target\": \"es\",\n   \"text\": \"bible\",\n   \"train_speakers_per_sentence\": 1,\n   \"unseen_synthesizer\": \"festival\"\n  },\n  \"eval_only_pairs\": \"\",\n  \"extra_test_splits\": \"tst-unseen-synth\",\n  \"loader_workers\": -1,\n  \"max_frames\": 6000,\n  \"max_source_frames\": 3000,\n  \"num_buckets\": 4,\n  \"pairs\": \"en-es\",\n  \"prepared_dir\": \"data/prepared/embedded_en_es\",\n  \"root\": \"data/embedded_en_es\",\n  \"seed\": 1,\n  \"specaugment\": false,\n  \"specaugment_policy\": \"lb\",\n  \"speed_perturb\": \"\",\n  \"st_vocab\": 1000,\n  \"target_lang_tag\": false,\n  \"test_split\": \"tst-COMMON\",\n  \"train_split\": \"train\"\n },\n \"eval\": {\n  \"after_training\": true,\n  \"average_around_best\": 7,\n  \"average_last\": 10,\n  \"batch_frames\": 20000,\n  \"beam\": 20,\n  \"checkpoint\": \"latest\",\n  \"ctc_weight\": 0.2,\n  \"length_penalty\": 1.3,\n  \"lm_order\": 3,\n  \"lm_stages\": [\n   \"asr\"\n  ],\n  \"lm_unigram\": \"wordfreq\",\n  \"lm_weight\": 0.3,\n  \"max_len_a\": 0.0,\n  \"max_len_b\": 60,\n  \"min_len\": 1,\n  \"no_repeat_ngram_size\": 4,\n  \"no_repeat_ngram_stages\": [\n   \"st\"\n  ],\n  \"num_buckets\": 1,\n  \"rate_norm_max_stretch\": 1.4,\n  \"rate_norm_stages\": [\n   \"asr\"\n  ],\n  \"rate_norm_target\": 0.5,\n  \"score_dev\": true,\n  \"score_dev_beam\": 5,\n  \"unk_penalty\": 0.0\n },\n \"model\": {\n  \"activation_dropout\": 0.0,\n  \"adapter_dim\": 0,\n  \"attention_dropout\": 0.0,\n  \"attention_implementation\": \"auto\",\n  \"conv_channels\": 128,\n  \"conv_kernels\": [\n   5,\n   5,\n   5\n  ],\n  \"conv_strides\": [\n   2,\n   2,\n   2\n  ],\n  \"d_model\": 128,\n  \"decoder_candidates\": 0,\n  \"decoder_heads\": 4,\n  \"decoder_layers\": 2,\n  \"decoder_task_tag\": \"\",\n  \"dropout\": 0.0,\n  \"dtype\": \"float32\",\n  \"encoder_candidates\": 0,\n  \"encoder_heads\": 4,\n  \"encoder_layers\": 6,\n  \"encoder_layout\": \"3x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2))\",\n  \"encoder_task_tag\": \"\",\n  \"ffn_dim\": 512,\n  \"ffn_token_chunk\": -1,\n  \"input_dim\": 80,\n  \"kernel_redraw\": \"fixed\",\n  \"kernel_seed\": 0,\n  \"key_block_size\": -1,\n  \"local_block_size\": 0,\n  \"max_target_positions\": 1024,\n  \"qkv_bias\": false,\n  \"selection_inference\": \"deterministic\",\n  \"selection_strategy\": \"group\",\n  \"selection_temperature\": 5.0,\n  \"task_tag\": \"\"\n },\n \"mt\": {\n  \"batch\": 64,\n  \"beam\": 5,\n  \"dropout\": 0.0,\n  \"encoder_layers\": 2,\n  \"eval_every\": 500,\n  \"length\": 0,\n  \"lr\": 0.003,\n  \"lr_scheduler\": \"polynomial_decay\",\n  \"max_updates\": 1000,\n  \"num_buckets\": 3,\n  \"score_dev\": true,\n  \"warmup_updates\": 100\n },\n \"name\": \"quickstart_v2\",\n \"reported\": {\n  \"averages\": \"\",\n  \"bleu\": -1.0,\n  \"source\": \"\",\n  \"wer\": -1.0\n },\n \"st\": {\n  \"ctc_weight\": 0.3,\n  \"decoder_init\": \"mt\",\n  \"encoder_init\": \"best\",\n  \"eval_every\": 1000,\n  \"frozen\": \"encoder/subsample\",\n  \"init_from\": \"\",\n  \"init_from_checkpoint\": \"latest\",\n  \"keep_last\": 4,\n  \"lr\": 0.003,\n  \"lr_scheduler\": \"polynomial_decay\",\n  \"max_updates\": 4300,\n  \"pairs\": \"\",\n  \"text_encoder\": \"mt\",\n  \"train_only\": \"\",\n  \"update_freq\": 1,\n  \"warmup_updates\": 100\n },\n \"train\": {\n  \"adam_b1\": 0.9,\n  \"adam_b2\": 0.98,\n  \"adam_eps\": 1e-08,\n  \"clip_norm\": 10.0,\n  \"compilation_cache\": \"~/.cache/multiformer_jax/jax\",\n  \"early_stop_patience\": 0,\n  \"kl_weight\": 0.0,\n  \"label_smoothing\": 0.1,\n  \"log_every\": 10,\n  \"max_consecutive_nonfinite\": 10,\n  \"parallel\": \"pmap\",\n  \"seed\": 1,\n  \"selection_lr_multiplier\": 1.0,\n  \"selection_temperature_decay\": 0.0,\n  \"selection_temperature_min\": 0.5,\n  \"stages\": [\n   \"asr\",\n   \"st\"\n  ]\n }\n}")
ENCODER_LAYOUT = '1x(4*local(7)) 1x(4*local(9)) 1x(4*local(7)) 1x(4*local(11)) 1x(4*local(9)) 1x(4*local(13))'


def get_config():
  config = ml_collections.ConfigDict(ANALYSED_CONFIG)
  config.name = 'quickstart_v2_windows'
  config.model.encoder_layout = ENCODER_LAYOUT
  config.reported = ml_collections.ConfigDict({"bleu": None, "wer": None, "source": ""})
  return config
