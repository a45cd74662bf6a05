"""How a stage's split is read and batched: PipelineConfig, whose fields marked `setting` are the
experiment's data.<field> keys, with their defaults, meaning and valid values.
"""

from __future__ import annotations

import dataclasses


from multiformer_common.errors import InvalidValue
from data_prep import features as features_lib
from multiformer_common import settings
from multiformer_common.settings import setting


CMVN_MODES = ("utterance", "global", "none")
SPEECH_STAGES = ("asr", "st")   # the stages whose data this pipeline reads (not the MT
                                # stage's: data/text_pairs.py; "task" is head selection's)
TAG_NAMES = ("source_lang", "target_lang", "domain", "pair", "speaker")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """How a stage's split is read and batched. The fields marked `setting` are the config keys
  data.<field> with their defaults and meaning (`config_defaults`); the others are the stage's
  (experiment.pipeline_config)."""
  prepared_dir: str
  stage: str = "st"                # asr: source transcripts; st: target translations
  max_frames: int = setting(
      40000, "padded source frames per batch (fairseq's --max-tokens): per global batch, x "
      "{stage}.update_freq per update; with data.frames_per_update set, per device")
  num_buckets: int = setting(8, "source-length buckets: distinct batch shapes per split")
  num_token_buckets: int = setting(
      1, "training: each source bucket split by target length into this many (fewer padded "
      "target tokens, more compiled shapes; 6: 13 % padded on MuST-C-like lengths, "
      "docs/benchmarks.md)")
  max_source_frames: int = setting(3000, "longer training utterances are skipped (counted)")
  max_target_tokens: int = 1023    # tokens before EOS: experiment.pipeline_config sets
                                   # model.max_target_positions - 1
  cmvn: str = setting("utterance", "utterance | global | none")
  specaugment: bool = setting(True, "SpecAugment on the training split")
  specaugment_policy: str = setting(
      "lb", "lb | ld | sm | ss (the SpecAugment paper's, fairseq's names), then optional "
      "overrides: 'sm,time_mask_p=0.1'")
  seed: int = setting(1, "the batches' order and SpecAugment's masks: a function of (seed, "
                      "epoch, position)")
  target_lang_tag: bool = setting(
      False, "ST targets start with <lang:xx> (one-to-many; forced at decoding)")
  source_ctc: bool = False         # st: batches also carry the source transcript in the ASR
                                   # vocabulary (ctc_targets), for the source CTC loss
  pairs: tuple[str, ...] = ()      # the language pairs used ('' = as the stage uses them)

  def __post_init__(self):
    if self.stage not in SPEECH_STAGES:
      raise InvalidValue(f"data stage {self.stage!r}; valid: {SPEECH_STAGES}")
    for name in ("num_buckets", "num_token_buckets"):
      if getattr(self, name) < 1:
        raise InvalidValue(f"data.{name}={getattr(self, name)}; valid: an integer >= 1")
    if self.cmvn not in CMVN_MODES:
      raise InvalidValue(f"data.cmvn={self.cmvn!r}; valid: {CMVN_MODES}")
    try:
      features_lib.SpecAugment.from_policy(self.specaugment_policy)
    except ValueError as e:
      raise InvalidValue(f"data.specaugment_policy: {e}") from None


def config_defaults() -> dict:
  """{field: default} of PipelineConfig's settings: the data.<field> keys of an experiment."""
  return settings.config_defaults(PipelineConfig)
