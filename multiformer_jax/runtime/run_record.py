"""What a run started with, kept beside its checkpoints and held to when it resumes or is read.

The config: `{workdir}/config.json`. A rerun into a workdir that has trained compares its
config with the saved one. Changes that leave the trained model and the data order as they
are (SAFE_CHANGES: more updates, another evaluation or logging period, evaluation settings, the
loader's processes; a stage's settings before that stage has trained) are logged and appended
to `config_changes.jsonl`; any other change is
refused, naming each key with its saved and new value, unless accepted explicitly
(`--accept_config_changes`), which is recorded the same way.

The corpus: `{workdir}/corpus.json` holds the sha256 of what the run read of its prepared
corpus: the SentencePiece models, the CMVN statistics and the training and dev indexes (the
data order). A resumed run, evaluate, translate and analyze refuse a prepared directory whose
files differ (a corpus prepared again gives another vocabulary of the same size, and a model
would decode garbage from it without a word).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import time

from multiformer_common.errors import InvalidValue
from multiformer_common import atomic

CONFIG = "config.json"
CHANGES = "config_changes.jsonl"
CORPUS = "corpus.json"
# Settings a resumed run may change: they alter neither the model nor the data order.
SAFE_CHANGES = ("name", "reported.*", "*.eval_every", "*.keep_last", "train.log_every",
                "train.compilation_cache", "train.checkpoint_every_minutes",
                "train.checkpoint_every_updates", "train.early_stop_patience",
                "train.max_consecutive_nonfinite", "data.loader_workers", "data.prepared_dir",
                "data.root", "eval.*")


def _flat(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def config_changes(saved: dict, new: dict) -> dict:
  """{dotted key: (saved value, new value)} of every setting that differs (missing: None)."""
  saved, new = _flat(saved), _flat(new)
  return {key: (saved.get(key), new.get(key)) for key in sorted(set(saved) | set(new))
          if saved.get(key) != new.get(key)}


def is_safe(key: str, new: dict, trained_stages: set[str] = frozenset()) -> bool:
  """Whether changing `key` leaves what has trained and its data order as they are: the
  SAFE_CHANGES, a stage's settings before it has trained, which stages the run trains, and a
  stage's max_updates unless its learning rate decays to 0 at max_updates."""
  section = key.split(".")[0]
  is_stage = isinstance(new.get(section), dict) and "max_updates" in new[section]
  if (is_stage and section not in trained_stages) or key == "train.stages":
    return True
  if key.endswith(".max_updates"):
    return new.get(key.rsplit(".", 1)[0], {}).get("lr_scheduler") != "polynomial_decay"
  return any(fnmatch.fnmatchcase(key, pattern) for pattern in SAFE_CHANGES)


def trained_stages(workdir: str) -> set[str]:
  """The stages of the run (its directories) with a checkpoint, or finished."""
  trained = set()
  for stage in os.listdir(workdir) if os.path.isdir(workdir) else ():
    for name in ("checkpoints", "progress", "DONE.json"):
      path = os.path.join(workdir, stage, name)
      if os.path.isfile(path) or (os.path.isdir(path) and any(
          n.isdigit() for n in os.listdir(path))):
        trained.add(stage)
  return trained


def record_config(workdir: str, config, accept_changes: bool = False,
                  log: logging.Logger | None = None):
  """Saves `config` as the run's config.json, after comparing it with the saved one where the
  run has trained (see the module's docstring); raises ValueError on a refused change."""
  log = log or logging.getLogger("multiformer_jax")
  path = os.path.join(workdir, CONFIG)
  text = config.to_json_best_effort(indent=1)
  trained = trained_stages(workdir)
  if os.path.exists(path) and trained:
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
    new = json.loads(text)
    changes = config_changes(saved, new)
    refused = {k: v for k, v in changes.items() if not is_safe(k, new, trained)}
    if refused and not accept_changes:
      listed = "; ".join(f"{k}: {old!r} -> {value!r}" for k, (old, value) in refused.items())
      raise InvalidValue(
          f"the config differs from the one this run started with ({path}) in settings that "
          f"change the model or the data order: {listed}. To train with them, start a new run "
          f"(another --workdir); to continue this one with them anyway, add "
          f"--accept_config_changes")
    if changes:
      for key, (old, value) in changes.items():
        log.info("config change on resume: %s: %r -> %r%s", key, old, value,
                 "" if key not in refused else " (accepted: --accept_config_changes)")
      with open(os.path.join(workdir, CHANGES), "a", encoding="utf-8") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "changes": {
            k: {"saved": old, "new": value, "accepted": k in refused}
            for k, (old, value) in changes.items()}}) + "\n")
  atomic.write_text(path, text)


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def corpus_files(prepared_dir: str, splits: tuple[str, ...]) -> dict[str, str]:
  """{file relative to prepared_dir: sha256} of what a model depends on: the vocabularies and
  CMVN statistics, and the indexes of `splits` (the data order)."""
  with open(os.path.join(prepared_dir, "prepared.json"), encoding="utf-8") as f:
    summary = json.load(f)
  names = [v["model"] for v in summary.get("vocab", {}).values()]
  names += [summary["gcmvn"]] if summary.get("gcmvn") else []
  names += [os.path.join("index", f"{split}.npz") for split in splits]
  return {name: _sha256(os.path.join(prepared_dir, name)) for name in names
          if os.path.exists(os.path.join(prepared_dir, name))}


def record_corpus(workdir: str, prepared_dir: str, splits: tuple[str, ...]):
  """Writes corpus.json on a run's first start; on a resume, refuses a prepared corpus that
  differs from the one recorded."""
  path = os.path.join(workdir, CORPUS)
  if os.path.exists(path):
    check_corpus(workdir, prepared_dir, "resume training")
    return
  atomic.write_json(path, {"prepared_dir": os.path.abspath(prepared_dir),
                           "files": corpus_files(prepared_dir, splits)}, indent=1)


def check_corpus(workdir: str, prepared_dir: str, what: str, data_order: bool = True):
  """Raises ValueError if a file of the recorded corpus differs in `prepared_dir` (a run
  without corpus.json, from before it was kept, is not checked). Without `data_order`, only
  what decoding reads (vocabularies, CMVN) is compared, not the indexes."""
  path = os.path.join(workdir, CORPUS)
  if not os.path.exists(path):
    return
  with open(path, encoding="utf-8") as f:
    recorded = json.load(f)
  differ = []
  for name, digest in recorded["files"].items():
    if not data_order and name.startswith("index"):
      continue
    file = os.path.join(prepared_dir, name)
    now = _sha256(file) if os.path.exists(file) else "missing"
    if now != digest:
      differ.append(f"{name} (sha256 {digest[:12]} when the run trained, "
                    f"{now[:12] if now != 'missing' else 'missing'} now)")
  if differ:
    raise InvalidValue(
        f"cannot {what}: {prepared_dir} is not the prepared corpus the run in {workdir} "
        f"trained on ({recorded['prepared_dir']}): {'; '.join(differ)}. The model's "
        f"vocabulary, features or data order would not be its own. Point "
        f"--config.data.prepared_dir (or the run's config.json) at the corpus it trained on")
