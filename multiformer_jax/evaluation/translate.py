"""Transcribe and translate your own audio files with a trained run.

    python -m multiformer_jax.translate --workdir runs/quickstart a.wav b.flac ...
        [--stages asr st] [--checkpoint best] [--beam 5] [--segment_seconds 20]
        [--task de] [--target_lang de]

For each file: the transcript (ASR stage) and the translation (ST stage), decoded with the
run's evaluation settings from its saved config (checkpoint selection, beam, length limits,
joint CTC weight, word-LM rescoring).
Audio is read as preparation reads it (any rate and channel count: downmixed and resampled to
16 kHz mono), turned into the same Kaldi fbank features and normalised as training normalised
them (data.cmvn). A file longer than --segment_seconds is decoded in consecutive segments of
that length, one at a time, whose outputs are joined. `translate_files` is the same for
notebooks.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from data_prep import cli_errors
from data_prep import features as features_lib
from data_prep import vocab as vocab_lib
from data_prep.audio import SAMPLE_RATE, AudioError, load_audio
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation.evaluate import (averaged_count, lm_rescorer, lm_settings,
                                                 stage_params)
from multiformer_jax.experiment import model_config_for, task_keys
from multiformer_jax.runtime.host_memory import set_up_host_allocator
from multiformer_jax.runtime.xla_flags import add_default_xla_flags
from multiformer_jax.evaluation.inference import make_translate_for, picked
from multiformer_jax.model import S2TModel


def audio_segments(path: str, segment_seconds: float) -> list[np.ndarray]:
  """The file's 16 kHz mono samples in consecutive pieces of at most segment_seconds (the
  last one shorter). Unreadable, missing or empty files raise ValueError naming the file."""
  if segment_seconds <= 0:
    raise ValueError(f"segment_seconds={segment_seconds}; give a positive number of seconds")
  try:
    samples, _ = load_audio(path)
  except AudioError as error:
    raise ValueError(f"{path}: {error}") from error
  size = max(1, int(round(segment_seconds * SAMPLE_RATE)))
  return [samples[start:start + size] for start in range(0, len(samples), size)]


class StageTranslator:
  """One stage of a run, ready to decode feature matrices: its model, parameters (the run's
  eval.checkpoint selection unless `checkpoint` is given), vocabulary and search."""

  def __init__(self, workdir: str, config, stage: str, checkpoint: str | None = None,
               beam: int | None = None, task: str | None = None,
               target_lang: str | None = None):
    e, d = config.eval, config.data
    self.stage, self.config = stage, config
    summary = _prepared_summary(d.prepared_dir)
    self.vocab = vocab_lib.Vocabulary(os.path.join(d.prepared_dir,
                                                   summary["vocab"][stage]["model"]))
    keys = task_keys(config, stage)
    self.model = S2TModel(model_config_for(config, self.vocab.size, keys, stage))
    self.tasks = None
    if keys:
      self.tasks = {side: stack_task_id(key, stage, task, target_lang)
                    for side, key in keys.items()}
    self.prefix = None
    if stage == "st" and d.target_lang_tag:
      symbol = self.vocab.symbol_id(vocab_lib.lang_tag(target_lang or ""))
      if symbol is None:
        langs = sorted(self.vocab.sp.id_to_piece(i)[6:-1] for i in self.vocab.lang_tag_ids)
        raise ValueError(f"this model translates into several languages: pass --target_lang, "
                         f"one of {langs}" + (f" (got {target_lang!r})" if target_lang else ""))
      self.prefix = symbol
    which = checkpoint or e.checkpoint
    self.params, self.checkpoint = stage_params(workdir, stage, which,
                                                averaged_count(config, which))
    self.gcmvn = ip.read_gcmvn(d.prepared_dir, summary) if d.cmvn == "global" else None
    lm = lm_settings(config, stage)
    self.pick = lm_rescorer(config, stage, lm, beam or e.beam, e.length_penalty) if lm else None
    self.translate = make_translate_for(self.model, e, beam, nbest=self.pick is not None)

  def __call__(self, feature_list: list[np.ndarray]) -> list[str]:
    """Normalised-as-in-training fbank matrices [frames, 80] -> one text each."""
    frames = max(len(f) for f in feature_list)
    batch = np.zeros((len(feature_list), frames, features_lib.NUM_MEL_BINS), np.float32)
    lengths = np.array([len(f) for f in feature_list], np.int32)
    for row, f in enumerate(feature_list):
      batch[row, :len(f)] = ip.apply_cmvn(f, self.config.data.cmvn, self.gcmvn)
    n = len(feature_list)
    tasks = None if self.tasks is None else tuple(
        jnp.full((n,), self.tasks[side], jnp.int32) if side in self.tasks else None
        for side in ("encoder", "decoder"))
    prefix = None if self.prefix is None else jnp.full((n,), self.prefix, jnp.int32)
    out = self.translate(self.params, jnp.asarray(batch), jnp.asarray(lengths), tasks, prefix,
                         jax.random.PRNGKey(self.config.train.seed))
    forced = 0 if prefix is None else 1
    tokens = np.asarray(out) if self.pick is None else picked(out, self.vocab, forced, self.pick)
    return [self.vocab.decode(row[forced:]) for row in tokens]


def stack_task_id(key: ip.TaskKey, stage: str, task: str | None, target_lang: str | None
                  ) -> int:
  """The task id of one keyed stack: a stack keyed by the target language (ST) takes
  --target_lang (else --task), every other one --task."""
  by_target = key.field == "target_lang" and stage == "st"
  value = (target_lang or task) if by_target else task
  if value not in key.names:
    option = "--target_lang" if by_target else "--task"
    raise ValueError(f"this model selects heads by {key.field}: pass {option}, one of "
                     f"{list(key.names)}" + (f" (got {value!r})" if value else ""))
  return key.names.index(value)


def _prepared_summary(prepared_dir: str) -> dict:
  import json  # pylint: disable=import-outside-toplevel
  path = os.path.join(prepared_dir, "prepared.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: the run's vocabulary lives in its prepared "
                            f"data (data.prepared_dir); run from the directory the run was "
                            f"trained in, or pass a workdir whose config names it")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def translate_files(workdir: str, paths, stages=("asr", "st"), checkpoint: str | None = None,
                    beam: int | None = None, segment_seconds: float = 20.0,
                    task: str | None = None, target_lang: str | None = None) -> list[dict]:
  """-> [{'path', 'segments', and per stage its text}] for each audio file, in order."""
  config = ckpt_lib.load_config(workdir)
  for stage in stages:
    if stage not in ip.TASKS:
      raise ValueError(f"stage {stage!r}; valid: {ip.TASKS}")
  translators = {stage: StageTranslator(workdir, config, stage, checkpoint, beam, task,
                                        target_lang) for stage in stages}
  results = []
  for path in paths:
    pieces = [features_lib.fbank(s) for s in audio_segments(path, segment_seconds)]
    pieces = [p for p in pieces if len(p) > 0]        # a tail shorter than one 25 ms window
    if not pieces:
      raise ValueError(f"{path}: shorter than one 25 ms analysis window")
    result = {"path": path, "segments": len(pieces)}
    for stage, translator in translators.items():
      # One segment at a time: a segment decodes exactly as the same audio alone would (the
      # segments of a file share one length but the last, so two compiled shapes per file).
      texts = [translator([piece])[0] for piece in pieces]
      result[stage] = " ".join(text for text in texts if text)
    results.append(result)
  return results


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="a run's workdir (run.py --workdir)")
  parser.add_argument("audio", nargs="+", help="audio files (wav, flac, mp3, ...)")
  parser.add_argument("--stages", nargs="+", default=["asr", "st"], choices=ip.TASKS)
  parser.add_argument("--checkpoint", default=None, choices=ckpt_lib.SELECTIONS,
                      help="default: the run's eval.checkpoint")
  parser.add_argument("--beam", type=int, default=None, help="default: the run's eval.beam")
  parser.add_argument("--segment_seconds", type=float, default=20.0,
                      help="longer files are decoded in segments of this length")
  parser.add_argument("--task", default=None,
                      help="multi-task models: the task of every stack not keyed by the target "
                           "language (e.g. the source language or the domain)")
  parser.add_argument("--target_lang", default=None,
                      help="one-to-many models: the language to translate into")
  args = parser.parse_args(argv)
  results = translate_files(args.workdir, args.audio, tuple(args.stages), args.checkpoint,
                            args.beam, args.segment_seconds, args.task, args.target_lang)
  labels = {"asr": "transcript", "st": "translation"}
  for result in results:
    print(f"{result['path']} ({result['segments']} segment(s))")
    for stage in args.stages:
      print(f"  {labels[stage]:<12}{result[stage]}")


# The command line and console script: user errors -> their message and exit status 2.
cli = cli_errors.command_line_entry(main)


if __name__ == "__main__":
  set_up_host_allocator()
  add_default_xla_flags()
  cli()
