"""Parameters carried between runs and stages: another run's same stage ({stage}.init_from, the
T5X-style partial restore), the ASR encoder into the ST model, and the MT stage's decoder and
encoder into the ST model. Each copies by parameter name, shapes must fit, and logs what was
restored, skipped and freshly initialised."""

from __future__ import annotations

import logging
import os

import flax
import jax.numpy as jnp
import numpy as np

from multiformer_common.errors import InvalidValue, MissingInput
from multiformer_jax.evaluation import results
from multiformer_jax.experiment import MT_STAGE
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime.train_log import DONE
from multiformer_jax.training.optimizer import flat_params, module_groups


def copy_tensors(params, source, take, labels=("source", "model")
                 ) -> tuple[dict, list[str], list[str]]:
  """Copies into `params` every tensor `take(name)` selects that `source` has, shapes fitting:
  -> (flat params, names restored, '<name>: <labels[0]> <shape> vs <labels[1]> <shape>' for
  the misfits)."""
  flat, flat_source = flat_params(params), flat_params(source)
  restored, mismatched = [], []
  for name, value in flat.items():
    if name in flat_source and take(name):
      shape = tuple(np.shape(flat_source[name]))
      if shape != tuple(value.shape):
        mismatched.append(f"{name}: {labels[0]} {shape} vs {labels[1]} {tuple(value.shape)}")
      else:
        flat[name] = jnp.asarray(flat_source[name], value.dtype)
        restored.append(name)
  return flat, restored, mismatched


def init_from_run(params, config, stage: str, log: logging.Logger):
  """{stage}.init_from: the parameters of another run's same stage (its workdir), selected by
  {stage}.init_from_checkpoint (averaging as many checkpoints as evaluation does); tensors the run lacks (new adapters, say) stay freshly
  initialised, shapes must fit. The T5X-style restore a two-step recipe needs."""
  stage_cfg = config[stage]
  directory = os.path.join(stage_cfg.init_from, stage, "checkpoints")
  if not os.path.isdir(directory):
    raise MissingInput(f"{stage}.init_from={stage_cfg.init_from!r}: no {directory}; give "
                            f"the workdir of a run that trained the {stage} stage")
  which = stage_cfg.init_from_checkpoint
  source, which = ckpt_lib.StageCheckpoints(directory).select_params(
      which, results.averaged_count(config, which))
  flat, restored, mismatched = copy_tensors(params, source, lambda name: True,
                                            ("there", "here"))
  if mismatched:
    raise InvalidValue(f"{stage}.init_from={stage_cfg.init_from!r} does not fit this model:\n  "
                     + "\n  ".join(mismatched))
  restored_names = set(restored)
  fresh = [n for n in flat if n not in restored_names]
  log.info("%s init from %s (%s): restored %d tensors, freshly initialised %d (%s)", stage,
           stage_cfg.init_from, which, len(restored), len(fresh), module_groups(fresh) or "none")
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def carry_from_asr(params, asr_params, log: logging.Logger):
  """ST init: the encoder from the ASR checkpoint, and its CTC head where both have one of the
  same size (an ST stage with CTC on the source transcript); the decoder, bound to the ASR
  vocabulary, and the rest fresh. Shapes must fit."""
  flat_asr = flat_params(asr_params)
  shapes = {name: np.shape(value) for name, value in flat_params(params).items()}
  carried = lambda name: name.startswith("encoder/") or (
      name.startswith("ctc_proj/") and name in flat_asr and
      np.shape(flat_asr[name]) == shapes.get(name))
  flat, restored, mismatched = copy_tensors(params, asr_params, carried, ("ASR", "ST"))
  missing = [n for n in flat if carried(n) and n not in flat_asr]
  if mismatched or missing:
    raise InvalidValue("the ASR checkpoint does not fit the ST model config:\n  " +
                     "\n  ".join(mismatched + [f"{n}: not in the ASR checkpoint"
                                               for n in missing]) +
                     "\nUse the same model.* settings for both stages.")
  restored_names = set(restored)
  fresh = [n for n in flat if n not in restored_names]
  skipped = sorted(n for n in flat_asr if not carried(n))
  log.info("ST init: restored %d encoder tensors from ASR, skipped %d ASR tensors (vocabulary-"
           "bound), freshly initialised %d tensors", len(restored), len(skipped), len(fresh))
  for title, names in (("restored", restored), ("skipped", skipped), ("fresh", fresh)):
    log.info("  %s: %s", title, module_groups(names))
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def read_mt_params(workdir: str):
  """The MT stage's parameters the ST stage starts from: its best checkpoint by dev loss."""
  stage_dir = os.path.join(workdir, MT_STAGE)
  if not os.path.exists(os.path.join(stage_dir, DONE)):
    raise MissingInput(f"{stage_dir}/{DONE} does not exist: the MT stage did not finish "
                            f"(rerun the same command to train it)")
  params, which = ckpt_lib.StageCheckpoints(os.path.join(stage_dir, "checkpoints")
                                            ).select_params("best")
  return params, which


def carry_from_mt_stage(params, workdir: str, log: logging.Logger, decoder: bool = True,
                        encoder: bool = False):
  """ST init from the MT stage's best parameters: every decoder tensor (`decoder`), and with
  `encoder` its source embeddings and encoder layers into the stacked text encoder (whose
  projection of the speech encoder's output stays at its start, zero). Shapes must fit."""
  mt, which = read_mt_params(workdir)
  source = {"decoder": mt["decoder"]} if decoder else {}
  if encoder:
    source["text_encoder"] = {k: v for k, v in mt.items() if k != "decoder"}
  prefixes = tuple(f"{side}/" for side in source)
  taken = lambda name: name.startswith(prefixes) and not name.startswith("text_encoder/acoustic/")
  flat, restored, mismatched = copy_tensors(params, source, taken, ("MT model", "ST"))
  missing = [n for n in flat if taken(n) and n not in set(restored)]
  if mismatched or missing:
    raise InvalidValue("the MT stage's model does not fit the ST model:\n  " +
                     "\n  ".join(mismatched + [f"{n}: not in the MT model" for n in missing]))
  log.info("ST init: the %s's %d tensors from the MT stage's %s",
           " and ".join(("decoder",) * decoder + ("stacked text encoder",) * encoder),
           len(restored), which)
  return flax.traverse_util.unflatten_dict(flat, sep="/")
