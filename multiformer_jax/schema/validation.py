"""An experiment's config checked once, when it is loaded (run.py, and a saved run's config
read back by evaluate, translate and analyze): every section's keys, types and values against
the classes that declare them, then what holds between keys. Errors name the key and what
would be valid. What depends on the prepared data or the devices (a stage's pairs, the
micro-batches per update) is checked where those are known."""

from __future__ import annotations

from multiformer_common import settings
from multiformer_common.settings import ConfigError
from data_prep.embedded import spec as embedded_spec
from multiformer_jax.data import input_pipeline
from multiformer_jax.experiment import MT_STAGE, stack_task_tags, stages_run
from multiformer_jax.model.model_config import ModelConfig
from multiformer_jax.schema import sections

SECTION_NAMES = ("name", "reported", "model", "data", "train", "asr", "st", "mt", "eval")


def check(config) -> ModelConfig:
  """Refuses a config that any part of a run would refuse later, before anything is built or
  trained. -> its ModelConfig (the prepared data's derived fields still at their defaults)."""
  present = set(config.keys())
  unknown, missing = sorted(present - set(SECTION_NAMES)), sorted(set(SECTION_NAMES) - present)
  if unknown or missing:
    raise ConfigError(f"config sections: unknown {unknown}, missing {missing}; valid: "
                      f"{list(SECTION_NAMES)} (start from multiformer_jax.schema."
                      f"base_config())")
  if not isinstance(config.name, str):
    raise ConfigError(f"name={config.name!r}: expected the experiment's name, a string")
  for name, cls in sections.SECTIONS.items():
    values = settings.typed_values(cls, dict(config[name]), name)
    settings.check_values(cls, values, name)
  _check_data(config.data)
  model = ModelConfig.from_dict(config.model)
  _check_between_keys(config)
  return model


def _check_data(data):
  """`data`: the corpus keys (DataSettings), the batching keys (PipelineConfig) and
  `data.embedded` (CorpusSpec), each checked by its class."""
  own = settings.config_fields(sections.DataSettings)
  batching = settings.config_fields(input_pipeline.PipelineConfig)
  values = {k: v for k, v in data.items() if k != "embedded"}
  typed = settings.typed_values(sections.DataSettings, values, "data", {**own, **batching})
  settings.check_values(sections.DataSettings, typed, "data")
  input_pipeline.PipelineConfig(prepared_dir=typed.get("prepared_dir", ""),
                                **{k: v for k, v in typed.items() if k in batching})
  names = typed.get("corpus", "").split(",")
  alone = ("embedded", "fairseq")
  if any(name not in sections.CORPORA for name in names) or (
      len(names) > 1 and set(alone) & set(names)):
    raise ConfigError(f"data.corpus={typed.get('corpus')!r}; valid: one of "
                      f"{list(sections.CORPORA)}, or several but {' and '.join(alone)}, "
                      f"comma-separated")
  roots = typed.get("root", "").split(",")
  if len(names) > 1 and typed.get("root") and len(roots) != len(names):
    raise ConfigError(f"data.corpus names {len(names)} corpora but data.root "
                      f"{typed.get('root')!r} {len(roots)} directories; give one root per "
                      f"corpus, comma-separated, in the same order")
  embedded = dict(data.get("embedded", {}))
  settings.refuse_unknown(embedded, embedded_spec.config_defaults(), "data.embedded")
  if typed.get("corpus") == "embedded":      # the builds it asks for, as data_setup reads them
    embedded_spec.specs_from_settings(embedded)


def _check_between_keys(config):
  train, e = config.train, config.eval
  if not train.stages:
    raise ConfigError(f"train.stages={tuple(train.stages)!r}: name at least one of "
                      f"{input_pipeline.SPEECH_STAGES}")
  _check_mt(config)
  for stage in stages_run(config):
    every = config[stage].eval_every
    if every < 1 and every != -1:
      raise ConfigError(f"{stage}.eval_every={every}; valid: a number of updates >= 1, or -1 "
                        f"for once per epoch")
    s = config[stage]
    if s.lr_scheduler == "polynomial_decay" and s.warmup_updates >= s.max_updates:
      raise ConfigError(f"{stage}.lr_scheduler='polynomial_decay' decays from warmup_updates "
                        f"to max_updates: {stage}.warmup_updates={s.warmup_updates} must be "
                        f"below {stage}.max_updates={s.max_updates}")
  if e.no_repeat_ngram_size == 1:
    raise ConfigError("eval.no_repeat_ngram_size=1: valid values are 0 (off) or an n-gram "
                      "length >= 2 (1 would ban every token already produced, the start token "
                      "EOS with them: no hypothesis could end)")
  _check_retention(config)


def _check_retention(config):
  """Averaging N checkpoints needs N kept: each stage's keep_last must cover eval.average_last
  where evaluation, or for the ASR stage the ST encoder init, averages the last N ("average");
  "around_best" keeps its own."""
  stages = config.train.stages
  needs = []
  if config.eval.checkpoint == "average":
    needs += [(stage, config.eval.average_last, "eval.average_last") for stage in stages]
  if "st" in stages and "asr" in stages and config.st.encoder_init == "average":
    needs.append(("asr", config.eval.average_last, "eval.average_last (st.encoder_init)"))
  for stage, count, key in needs:
    if config[stage].keep_last < count:
      raise ConfigError(f"{stage}.keep_last={config[stage].keep_last} keeps fewer checkpoints "
                        f"than {key}={count} averages; set {stage}.keep_last >= {count} or "
                        f"lower {key}")


def _check_mt(config):
  """What the MT stage needs when the ST stage reads it (st.decoder_init or st.text_encoder
  'mt')."""
  st = config.st
  if st.text_encoder and not st.ctc_weight > 0:
    raise ConfigError("st.text_encoder='mt' reads the ST stage's CTC head over the source "
                      f"pieces: set st.ctc_weight > 0 (it is {st.ctc_weight})")
  if MT_STAGE not in stages_run(config):
    return
  mt = config.mt
  setting = ("st.decoder_init='mt'" if st.decoder_init == MT_STAGE
             else "st.text_encoder='mt'")
  if mt.max_updates < 1:
    raise ConfigError(f"{setting} trains an MT stage: mt.max_updates={mt.max_updates} must be "
                      f">= 1")
  for key, value, why in (("pairs", mt.pairs, "it trains on the ST stage's pairs (st.pairs)"),
                          ("ctc_weight", mt.ctc_weight, "the MT model has no CTC head")):
    if value:
      raise ConfigError(f"mt.{key}={value!r}; valid: {'' if key == 'pairs' else 0} ({why})")
  tags = stack_task_tags(config.model)
  if any(tags.values()):
    raise ConfigError(f"{setting} needs a model without task-keyed stacks (model task tags "
                      f"{tags}): the MT model has no task ids")
