"""What an experiment's config means for one stage: its data pipeline (the pairs it uses), its
task keys, its model config and its loss, as training, evaluation and the analyses all read
them."""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.model import S2TModel, init_params
from multiformer_jax.model.model_config import ModelConfig


def stage_pairs(config, stage: str) -> tuple[str, ...]:
  """The language pairs a stage trains and is evaluated on: {stage}.pairs, comma-separated
  ('' = every prepared pair for ASR, every translation pair for ST)."""
  pairs = config[stage].pairs if stage in config else ""
  return tuple(p.strip() for p in pairs.split(",") if p.strip())


@dataclasses.dataclass(frozen=True)
class UpdatePlan:
  """How one update of a stage is made: `update_freq` micro-batches of `batch_frames` padded
  source frames each (every device's slice together), over `devices` devices."""
  batch_frames: int
  update_freq: int
  devices: int

  @property
  def frames_per_update(self) -> int:
    return self.batch_frames * self.update_freq

  @property
  def device_frames(self) -> int:
    return self.batch_frames // self.devices


def update_plan(config, stage: str, devices: int | None = None) -> UpdatePlan:
  """The stage's update from the config: with data.frames_per_update (the recipe's update,
  e.g. the thesis's 320k frames), data.max_frames is each device's batch (fairseq's
  --max-tokens) and the micro-batches per update follow from the device count (fairseq's
  update_freq x GPUs); without it, {stage}.update_freq global batches of data.max_frames.
  An update that does not divide into whole micro-batches is refused with ones that do."""
  d, freq = config.data, config[stage].update_freq
  devices = devices or jax.device_count()
  if not d.frames_per_update:
    if freq < 1:
      raise InvalidValue(f"{stage}.update_freq={freq}; valid: >= 1, or 0 with "
                       f"data.frames_per_update set (then it is derived)")
    return UpdatePlan(d.max_frames, freq, devices)
  if freq:
    raise InvalidValue(f"{stage}.update_freq={freq} and data.frames_per_update="
                     f"{d.frames_per_update} both set the update: set {stage}.update_freq=0 "
                     f"(derived from the device count) or data.frames_per_update=0")
  step_frames = d.max_frames * devices
  if d.max_frames < 1 or d.frames_per_update % step_frames:
    fitting = [d.frames_per_update // (devices * k) for k in range(1, 65)
               if d.frames_per_update % (devices * k) == 0][:6]
    raise InvalidValue(f"data.frames_per_update={d.frames_per_update} is not a whole number of "
                     f"micro-batches of data.max_frames={d.max_frames} per device x {devices} "
                     f"device(s) = {step_frames} frames; per-device batches that divide it on "
                     f"{devices} device(s): {fitting or 'none: change data.frames_per_update'}")
  return UpdatePlan(step_frames, d.frames_per_update // step_frames, devices)


def pipeline_config(config, stage: str, split_kind: str = "train") -> ip.PipelineConfig:
  """The pipeline of `stage` for a split of `split_kind` (train, dev or test): training
  and dev batches are the stage's micro-batches (update_plan), test batches eval.*'s."""
  d = config.data
  return ip.PipelineConfig(
      prepared_dir=d.prepared_dir, stage=stage,
      max_frames=(update_plan(config, stage).batch_frames if split_kind != "test"
                  else config.eval.batch_frames),
      num_buckets=d.num_buckets if split_kind != "test" else config.eval.num_buckets,
      num_token_buckets=d.num_token_buckets if split_kind == "train" else 1,
      max_source_frames=d.max_source_frames,
      max_target_tokens=config.model.max_target_positions - 1, cmvn=d.cmvn,
      specaugment=d.specaugment and split_kind == "train",
      specaugment_policy=d.specaugment_policy,
      seed=d.seed, source_ctc=stage == "st" and stage_ctc_weight(config, "st") > 0,
      target_lang_tag=d.target_lang_tag, pairs=stage_pairs(config, stage))


def stack_task_field(tag: str, stage: str) -> str:
  """The tag column a stack keyed by `tag` reads in `stage`: an ASR decoder writes the source
  language, so its target_lang is the source_lang."""
  return "source_lang" if stage == "asr" and tag == "target_lang" else tag


def stack_task_tags(model) -> dict[str, str]:
  """{'encoder' | 'decoder': the stack's task tag}: its own model.{side}_task_tag or the shared
  model.task_tag ('' = one task). `model`: config.model or a dict of its keys."""
  return {side: model[f"{side}_task_tag"] or model["task_tag"]
          for side in ("encoder", "decoder")}


def task_keys(config, stage: str) -> dict[str, ip.TaskKey] | None:
  """{'encoder' | 'decoder': TaskKey} of a multi-task model, or None for a one-task model.

  The task names are the values of the stack's tag over the whole training split, every pair
  of it, whichever pairs the stage uses: the encoder's ids are then the same in ASR and ST
  (the ST encoder starts from the ASR one), and a language the ST stage never trains on but
  the ASR stage did (a zero-shot direction's source) still has its task. Evaluation and the
  analyses use these, not the evaluated split's values."""
  tags = stack_task_tags(config.model)
  if not any(tags.values()):
    return None
  inventory = ip.tag_inventory(config.data.prepared_dir, config.data.train_split)
  keys = {}
  for side, tag in tags.items():
    if tag:
      field = stack_task_field(tag, stage) if side == "decoder" else tag
      keys[side] = ip.TaskKey(field, tuple(inventory[field]))
  return keys


def training_pairs(config, stage: str) -> list[str]:
  """The pairs the stage trains on (the training split's, as the stage uses them): a test
  direction outside them is zero-shot."""
  present = ip.tag_inventory(config.data.prepared_dir, config.data.train_split)["pair"]
  return ip.used_pairs(present, pipeline_config(config, stage), config.data.train_split)


def known_task_rows(data: ip.SplitData, tasks: dict[str, ip.TaskKey] | None
                    ) -> tuple[ip.SplitData, dict[str, int]]:
  """-> (the rows of `data` that every keyed stack has a task for, {'<field> <value>': rows
  left out}). A model keyed by language pair has no task for a direction it never trained on
  (the paper's adapters and mTEDx's zero-shot directions): those rows are counted, not
  decoded with another task's parameters. Raises if no row is left."""
  if not tasks:
    return data, {}
  keep = np.ones(len(data), bool)
  unknown = collections.Counter()
  for key in tasks.values():
    missing = key.ids(data) < 0
    keep &= ~missing
    unknown.update(f"{key.field} {v}" for v in data.tag_values[key.field][missing])
  if not keep.any():
    raise InvalidValue(f"no utterance of {data.split} has a task the model knows: its values "
                     f"{dict(unknown)}; the model's tasks: "
                     f"{ {side: list(k.names) for side, k in tasks.items()} }")
  return (data if keep.all() else data.subset(keep)), dict(sorted(unknown.items()))


def stage_key(config, stage: str):
  """The PRNG key a stage starts from (its initial parameters and its dropout stream)."""
  return jax.random.fold_in(jax.random.PRNGKey(config.train.seed), len(stage))


def initial_params(model: S2TModel, key):
  """The parameters training initialises from `key` (before any ST encoder carry)."""
  return init_params(model, jax.random.split(key)[0])


def stage_ctc_weight(config, stage: str | None) -> float:
  """The stage's CTC weight: ASR's CTC spells the transcript the decoder writes; ST's spells the
  source transcript (in the ASR vocabulary) while the decoder writes the translation, the
  multi-task encoder loss of ESPnet-ST and fairseq's speech-to-text CTC auxiliary."""
  if stage is None or stage not in config:
    return 0.0
  weight = float(config[stage].ctc_weight)
  if not 0.0 <= weight < 1.0:
    raise InvalidValue(f"{stage}.ctc_weight={weight}; valid: 0 <= weight < 1")
  return weight


def source_ctc_vocab_size(config) -> int:
  """The size of the ASR vocabulary the ST stage's source-transcript CTC spells."""
  vocabularies = ip.read_summary(config.data.prepared_dir)["vocab"]
  if "asr" not in vocabularies:
    raise InvalidValue(f"st.ctc_weight is set but {config.data.prepared_dir} has no ASR "
                     f"vocabulary for the source transcripts; set st.ctc_weight=0")
  return int(vocabularies["asr"]["size"])


def stacks_text_encoder(config) -> bool:
  """Whether the ST model stacks the MT stage's encoder on its speech encoder
  (st.text_encoder="mt"; model/stacked.py)."""
  return "st" in config and config.st.text_encoder == "mt"


MT_STAGE = "mt"


def st_decoder_from_mt(config) -> bool:
  """Whether the ST stage starts its decoder from the MT stage's (st.decoder_init="mt")."""
  return "st" in config.train.stages and config.st.decoder_init == MT_STAGE


def st_encoder_from_mt(config) -> bool:
  """Whether a trained ST stage stacks the MT stage's encoder on its speech encoder."""
  return "st" in config.train.stages and stacks_text_encoder(config)


def stages_run(config) -> tuple[str, ...]:
  """The stages a run trains, in order: train.stages, with the MT stage before ST where the
  ST stage starts its decoder or stacked text encoder from it."""
  stages = tuple(config.train.stages)
  if not (st_decoder_from_mt(config) or st_encoder_from_mt(config)):
    return stages
  at = stages.index("st")
  return stages[:at] + (MT_STAGE,) + stages[at:]


def stacked_text_layers(config) -> int:
  """The ST model's stacked text encoder's layers: the MT stage's, where it stacks one."""
  return int(config.mt.encoder_layers) if stacks_text_encoder(config) else 0


def model_config_for(config, vocab_size: int, tasks: dict | None = None,
                     stage: str | None = None) -> ModelConfig:
  """The model config with the sizes the data decides: the vocabulary and, for a multi-task
  model, the number of tasks of each stack (`tasks`, from task_keys); with a stage whose
  ctc_weight is set, a CTC head."""
  ctc = stage_ctc_weight(config, stage) > 0
  values = {**config.model.to_dict(), "vocab_size": vocab_size, "ctc_head": ctc,
            "ctc_vocab_size": source_ctc_vocab_size(config) if ctc and stage == "st" else 0,
            "text_encoder_layers": stacked_text_layers(config) if stage == "st" else 0}
  for side, tag in stack_task_tags(values).items():
    if tag:
      if not tasks or side not in tasks:
        raise InvalidValue(f"the model's {side} is keyed by a task tag: its task names "
                         f"(experiment.task_keys) are needed")
      values[f"{side}_num_tasks"] = max(1, len(tasks[side].names))
  return ModelConfig.from_dict(values)
