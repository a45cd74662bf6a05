"""The run's prepared data: data.prepared_dir prepared from data.root when it is missing (the
embedded corpus built into data.root first where data.corpus is "embedded"), and the splits
evaluation after training reads."""

from __future__ import annotations

import logging
import os

from multiformer_common.errors import MissingInput
from data_prep import prepare
from multiformer_common import locks
from data_prep.embedded import build as embedded_build
from data_prep.embedded import spec as embedded_spec
from multiformer_jax.data import input_pipeline as ip

EMBEDDED = "embedded"      # data.corpus: the embedded corpus, built then read as MuST-C


def embedded_specs(config) -> list[embedded_spec.CorpusSpec]:
  """The embedded corpus builds a config asks for (data.embedded.*), [] for another corpus."""
  if config.data.corpus != EMBEDDED:
    return []
  return embedded_spec.specs_from_settings(config.data.embedded.to_dict())


def ensure_prepared(config, log: logging.Logger):
  """Prepares data.prepared_dir from data.root when needed (builds the embedded corpus first
  where data.corpus is "embedded"); a no-op when it is already prepared."""
  d = config.data
  specs = embedded_specs(config)
  if os.path.exists(os.path.join(d.prepared_dir, "prepared.json")):
    for spec in specs:     # an embedded corpus of another spec: refused, not silently used
      for source, target in spec.directions():
        embedded_build.is_built(embedded_build.direction_dir(d.root, source, target), spec)
    return
  if not d.root:
    raise MissingInput(f"data.prepared_dir={d.prepared_dir!r} is not prepared and "
                            f"data.root is empty: set --config.data.root to the corpus "
                            f"download directory, or run python -m data_prep.prepare")
  if specs:
    # One build at a time (ablate --jobs starts several runs at once): the others wait, then
    # find the directions built.
    os.makedirs(d.root, exist_ok=True)
    with locks.DirectoryLock(d.root, "corpus build").acquire(wait=True, log=log):
      log.info("building the embedded corpus in %s", d.root)
      for spec in specs:
        embedded_build.build(d.root, spec)
  extra = extra_test_splits(config)
  if specs:      # an embedded split a synthesizer that cannot be had here would speak: none
    built = set().union(*(embedded_build.effective_spec(s, lambda m: None).splits()
                          for s in specs))
    extra = [s for s in extra if s in built]
  log.info("preparing %s -> %s", d.root, d.prepared_dir)
  prepare.prepare("mustc" if specs else d.corpus, d.root, d.pairs.split(","), d.prepared_dir,
                  [d.train_split, d.dev_split, d.test_split, *extra], d.asr_vocab, d.st_vocab,
                  speed_perturb=prepare.parse_speeds(d.speed_perturb),
                  speed_perturb_domains=tuple(x for x in d.speed_perturb_domains.split(",") if x),
                  eval_only_pairs=[p for p in d.eval_only_pairs.split(",") if p],
                  train_only_pairs=sorted({p for spec in specs for p in embedded_build
                                           .effective_spec(spec, lambda m: None)
                                           .transcription_pairs()}))


def extra_test_splits(config) -> list[str]:
  """data.extra_test_splits as a list."""
  return [s.strip() for s in config.data.extra_test_splits.split(",") if s.strip()]


def evaluated_splits(config) -> list[str]:
  """The splits evaluation after training reads: data.test_split, then each of
  data.extra_test_splits that was prepared."""
  prepared = ip.read_summary(config.data.prepared_dir)["splits"]
  return [config.data.test_split] + [s for s in extra_test_splits(config) if s in prepared]
