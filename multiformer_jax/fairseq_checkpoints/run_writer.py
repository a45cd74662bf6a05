"""A fairseq S2T checkpoint becomes a run: `evaluate`, `analyze` and `translate` read it like a
run of run.py, and run.py fine-tunes from it (`--config.st.init_from=OUT`).

The library of the `import_fairseq` command (multiformer_jax/import_fairseq.py, where its
options are). Writes OUT/config.json (the model as fairseq's arguments define it, the data as
the yaml says), OUT/{stage}/checkpoints (orbax, one step: the checkpoint's update count) with DONE.json,
and the data root's index (OUT/prepared unless --prepared_dir; data_prep.fairseq_data: the
features stay in fbank80.zip, the vocabulary is fairseq's SentencePiece model and dictionary).
A `.pt` is read without torch and without running code from its pickle: only what fairseq
checkpoints hold is built, anything else refused by name (fairseq_checkpoints/safe_pickle.py;
--trust_pickle unpickles fully with torch). A `.npz` of the state dict (`sd/NAME` arrays and
`args` as JSON, the form of tests/fixtures/make_fairseq_fixture.py) is read too.
Nothing is written unless the checkpoint, the data and their vocabulary fit together.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from multiformer_common.errors import ExistingOutput, InvalidValue, MissingInput
from data_prep import fairseq_data, vocab
from multiformer_common import atomic
from multiformer_jax.model import S2TModel
from multiformer_jax.fairseq_checkpoints.checkpoint import (FairseqImportError, convert_state_dict,
                                                  head_selection_tasks,
                                                  model_config_from_fairseq,
                                                  read_fairseq_checkpoint)
from multiformer_jax.model.model_config import ModelConfig
from multiformer_jax.experiment import model_config_for, task_keys
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime.train_log import DONE
from multiformer_jax.training import optimizer, steps
from multiformer_jax import schema

# fairseq's own MuST-C evaluation (examples/speech_to_text/docs/mustc_example.md): beam 5.
FAIRSEQ_BEAM = 5
SIZED_BY_DATA = ("vocab_size", "ctc_head", "ctc_vocab_size", "encoder_num_tasks",
                 "decoder_num_tasks")


def read_checkpoint(path: str, trust_pickle: bool = False) -> tuple[dict, dict, int]:
  """-> (model args, state dict of arrays, the checkpoint's update count or 0). A `.pt` is
  read without running code from it unless `trust_pickle` (checkpoint.read_fairseq_checkpoint)."""
  if not os.path.isfile(path):
    raise MissingInput(f"fairseq checkpoint {path} not found")
  if path.endswith(".npz"):
    arrays = np.load(path)
    if "args" not in arrays.files:
      raise FairseqImportError(f"{path}: a .npz checkpoint holds sd/NAME arrays and 'args' "
                               f"(JSON); it has no 'args'")
    args = json.loads(str(arrays["args"]))
    state = {k[3:]: arrays[k] for k in arrays.files if k.startswith("sd/")}
    return args, state, int(args.get("num_updates", 0) or 0)
  return read_fairseq_checkpoint(path, trust_pickle)


def load_checkpoint(path: str, trust_pickle: bool = False) -> tuple[ModelConfig, dict, int]:
  """-> (model config, params, the checkpoint's update count or 0)."""
  args, state, updates = read_checkpoint(path, trust_pickle)
  config = model_config_from_fairseq(args, state)
  return config, convert_state_dict(state, config), updates


def _splits(available: list[str]) -> tuple[str, str, str]:
  """(train, dev, test) split names of the root: MuST-C's where present."""
  pick = lambda names, default: next((n for n in names if n in available), default)
  train = pick(("train",), available[0])
  dev = pick(("dev", "valid"), available[min(1, len(available) - 1)])
  test = pick(("tst-COMMON", "test"), available[-1])
  return train, dev, test


def run_config(model: ModelConfig, summary: dict, prepared_dir: str, stage: str, name: str):
  """The config of the imported run: fairseq's model, the data as its yaml says."""
  config = schema.base_config()
  config.name = name
  m = config.model
  for key, value in model.to_dict().items():
    if key in SIZED_BY_DATA:
      continue
    m[key] = list(value) if isinstance(value, tuple) else value
  d = config.data
  d.corpus, d.root, d.prepared_dir = "fairseq", summary["root"], prepared_dir
  d.pairs = ",".join(summary["pairs"])
  d.train_split, d.dev_split, d.test_split = _splits(list(summary["splits"]))
  transforms = summary["transforms"][stage]
  d.cmvn = transforms["cmvn"]
  d.specaugment = bool(transforms["specaugment"])
  if transforms["specaugment"]:
    d.specaugment_policy = transforms["specaugment"]
  d.target_lang_tag = transforms.get("prepend_tgt_lang_tag", False) and stage == "st"
  config.train.stages = (stage,)
  config.eval.beam = FAIRSEQ_BEAM
  config.eval.checkpoint = "latest"
  return config


def import_run(checkpoint: str, data: str, stage: str, out: str,
               config_yaml: str | None = None, prepared_dir: str | None = None,
               trust_pickle: bool = False) -> dict:
  """Writes the run; returns {"config", "step", "prepared_dir", "vocab_size"}."""
  if stage not in ("asr", "st"):
    raise InvalidValue(f"--stage {stage!r}; valid: asr, st")
  if os.path.exists(os.path.join(out, stage, "checkpoints")):
    raise ExistingOutput(f"{out} already holds a {stage} stage: choose another --out")
  args, state, updates = read_checkpoint(checkpoint, trust_pickle)
  model = model_config_from_fairseq(args, state)
  params = convert_state_dict(state, model)
  prepared_dir = os.path.abspath(prepared_dir or os.path.join(out, "prepared"))
  yaml_path = os.path.join(data, config_yaml or f"config_{stage}.yaml")
  made = [path for path in (out, prepared_dir) if not os.path.exists(path)]
  try:
    summary = fairseq_data.write_index(data, prepared_dir, yaml_paths={stage: yaml_path})
    return _write_run(checkpoint, model, params, updates, summary, prepared_dir, yaml_path,
                      stage, out, head_selection_tasks(args))
  except Exception:
    for path in made:        # nothing half-written: what this import created goes
      shutil.rmtree(path, ignore_errors=True)
    raise


def _write_run(checkpoint, model, params, updates, summary, prepared_dir, yaml_path, stage,
               out, trained_tasks=None) -> dict:
  if stage not in summary["vocab"]:
    raise fairseq_data.FairseqDataError(f"{summary['root']}: no {yaml_path} for the {stage} "
                                        f"stage")
  dictionary = vocab.load(prepared_dir, summary["vocab"][stage])
  if dictionary.size != model.vocab_size:
    raise FairseqImportError(
        f"the dictionary {summary['vocab'][stage]['dictionary']} numbers {dictionary.size} "
        f"symbols (4 specials + its lines) but the checkpoint's output layer has "
        f"{model.vocab_size}: pass the yaml of the data the model was trained on")
  feature_dim = summary.get("feature_dim", 80)
  if feature_dim != model.input_dim:
    raise FairseqImportError(f"the data's features have {feature_dim} values a frame, the "
                             f"checkpoint's model reads {model.input_dim}")
  name = f"fairseq_{os.path.splitext(os.path.basename(checkpoint))[0]}"
  config = run_config(model, summary, prepared_dir, stage, name)

  tasks = task_keys(config, stage)
  _check_tasks(model, tasks, trained_tasks, summary)
  rebuilt = model_config_for(config, dictionary.size, tasks, stage)
  if rebuilt != model:
    differ = {k: (v, getattr(rebuilt, k)) for k, v in model.to_dict().items()
              if getattr(rebuilt, k) != v}
    raise FairseqImportError(f"the run's config does not rebuild the checkpoint's model: "
                             f"{differ}")
  s2t = S2TModel(model)
  tx, _ = optimizer.make_optimizer(config.train, config[stage])
  state = steps.create_state(s2t, tx, jax.random.PRNGKey(0))
  fresh = jax.tree_util.tree_structure(state.params)
  imported = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
  if jax.tree_util.tree_structure(imported) != fresh:
    raise FairseqImportError("the converted parameters do not have the model's structure")
  state = state.replace(params=imported)
  step = max(int(updates), 1)
  os.makedirs(out, exist_ok=True)
  ckpt_lib.save_config(out, config)
  checkpoints = ckpt_lib.StageCheckpoints(os.path.join(out, stage, "checkpoints"))
  checkpoints.save(step, state, {"stage": stage, "step": step, "dev_loss": None,
                                 "model": model.to_dict(),
                                 "imported_from": os.path.abspath(checkpoint)})
  done = {"stage": stage, "updates": step, "imported_from": os.path.abspath(checkpoint),
          "best_step": step, "early_stopped": False}
  atomic.write_json(os.path.join(out, stage, DONE), done, indent=1)
  return {"config": config, "step": step, "prepared_dir": prepared_dir,
          "vocab_size": dictionary.size}


def _check_tasks(model: ModelConfig, tasks, trained_tasks, summary):
  """A head-selection model's task ids must mean in the data what they meant in training: the
  data's training split has the languages (or domains) of the checkpoint's training subsets,
  the same count when the checkpoint does not name them."""
  for side, key in (tasks or {}).items():
    selecting = getattr(model, f"{side}_candidates")
    count = getattr(model, f"{side}_num_tasks") or model.num_tasks
    if not selecting:
      continue
    names = tuple(str(name) for name in key.names)
    expected = (trained_tasks or {}).get(side)
    if (expected is not None and names != expected) or len(names) != count:
      trained = f"{list(expected)}" if expected is not None else f"{count} tasks"
      raise FairseqImportError(
          f"the checkpoint's {side} selects heads for {trained} ({key.field} of its training "
          f"subsets, in id order) but the data root's training split "
          f"({summary['root']}) has {key.field} {list(names)}: import with the root it was "
          f"trained on (its train_SRC_TGT_DOMAIN.tsv subsets)")
