"""What an experiment's config means for one stage: its data pipeline, its model config and
its loss, as training, evaluation and the analyses all read them."""

from __future__ import annotations

from multiformer_jax import input_pipeline as ip
from multiformer_jax.model_config import ModelConfig


def pipeline_config(config, task: str, split_kind: str = "train") -> ip.PipelineConfig:
  d = config.data
  return ip.PipelineConfig(
      prepared_dir=d.prepared_dir, task=task,
      max_frames=d.max_frames if split_kind != "test" else config.eval.batch_frames,
      num_buckets=d.num_buckets if split_kind != "test" else config.eval.num_buckets,
      max_source_frames=d.max_source_frames,
      max_target_tokens=config.model.max_target_positions - 1, cmvn=d.cmvn,
      specaugment=d.specaugment and split_kind == "train", seed=d.seed,
      target_lang_tag=d.target_lang_tag)


def training_tags(config, stage: str):
  """The training split's tag values ({tag: sorted values}) that give a multi-task model its
  task ids, or None for a one-task model (evaluation and analyses must use these, not the
  evaluated split's)."""
  if not config.model.task_tag:
    return None
  return ip.split_tags(ip.SplitData(pipeline_config(config, stage), config.data.train_split))


def stage_ctc_weight(config, stage: str | None) -> float:
  """The stage's CTC weight (ASR only: CTC needs the transcripts, which ST batches lack)."""
  if stage is None or stage not in config:
    return 0.0
  weight = float(config[stage].get("ctc_weight", 0.0))
  if not 0.0 <= weight < 1.0:
    raise ValueError(f"{stage}.ctc_weight={weight}; valid: 0 <= weight < 1")
  if weight and stage != "asr":
    raise ValueError(f"{stage}.ctc_weight={weight}: the CTC loss needs transcripts, which only "
                     f"the ASR stage has; set it on asr.ctc_weight")
  return weight


def model_config_for(config, vocab_size: int, tags=None, stage: str | None = None
                     ) -> ModelConfig:
  """The model config with the sizes the data decides: the vocabulary and, for a multi-task
  model, the number of tasks (the training split's distinct values of model.task_tag); with a
  stage whose ctc_weight is set, a CTC head."""
  values = {**config.model.to_dict(), "vocab_size": vocab_size,
            "ctc_head": stage_ctc_weight(config, stage) > 0}
  if config.model.task_tag:
    if tags is None:
      raise ValueError("model.task_tag is set: the training split's tags are needed")
    values["num_tasks"] = max(1, len(tags[config.model.task_tag]))
  return ModelConfig.from_dict(values)
