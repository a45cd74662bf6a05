"""Transcribe and translate your own audio files with a trained run.

    python -m multiformer_jax.translate --workdir runs/quickstart DIR/*.wav
        [--output results.jsonl | results.tsv] [--stages asr st] [--checkpoint best]
        [--beam 5] [--segment_seconds 20] [--task de] [--target_lang de]
        [--rate_norm_target 0]

Each file's transcript (ASR stage) and translation (ST stage), decoded with the run's evaluation
settings; long files are cut at their pauses, results are written as files finish, a rerun with
the same --output skips the files already in it, and a file that cannot be used is reported on
stderr with its reason while the others go on (exit status 1 then). How:
multiformer_jax/evaluation/audio_files.py.
"""

from __future__ import annotations

import argparse
import sys

from multiformer_common.progress import progress_bar
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import audio_files
from multiformer_jax.evaluation import translation_output as output_lib
from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.runtime import compile_clock, process_setup


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="a run's workdir (run.py --workdir)")
  parser.add_argument("audio", nargs="+", help="audio files (wav, flac, mp3, ...)")
  parser.add_argument("--output", default=None,
                      help="write the results to this file (.tsv or .jsonl) instead of stdout; "
                           "a rerun skips the files already in it")
  parser.add_argument("--format", default=None, choices=output_lib.FORMATS,
                      help="default: from --output's extension, text on stdout")
  parser.add_argument("--stages", nargs="+", default=["asr", "st"], choices=ip.SPEECH_STAGES)
  parser.add_argument("--checkpoint", default=None, choices=ckpt_lib.SELECTIONS,
                      help="default: the run's eval.checkpoint")
  parser.add_argument("--beam", type=int, default=None, help="default: the run's eval.beam")
  parser.add_argument("--segment_seconds", type=float, default=audio_files.DEFAULT_SEGMENT_SECONDS,
                      help="longer files are cut at pauses into segments of at most this")
  parser.add_argument("--batch_frames", type=int, default=None,
                      help="padded frames per batch (default: the run's eval.batch_frames)")
  parser.add_argument("--task", default=None,
                      help="multi-task models: the task of every stack not keyed by the target "
                           "language (e.g. the source language or the domain)")
  parser.add_argument("--target_lang", default=None,
                      help="one-to-many models: the language to translate into")
  parser.add_argument("--rate_norm_target", type=float, default=None,
                      help="speaking-rate normalisation: CTC greedy pieces per encoder position "
                           "above which a segment is slowed down before decoding; 0 = off "
                           "(default: the run's eval.rate_norm_target)")
  args = parser.parse_args(argv)
  stages = tuple(args.stages)
  fmt = output_lib.output_format(args.output, args.format)
  done = output_lib.paths_written(args.output, fmt) if args.output else set()
  paths = [p for p in args.audio if p not in done]
  if done:
    print(f"{len(args.audio) - len(paths)} of {len(args.audio)} files are already in "
          f"{args.output}; decoding the other {len(paths)}", file=sys.stderr)
  decoder = audio_files.FileDecoder(args.workdir, stages, args.checkpoint, args.beam,
                              args.segment_seconds, args.task, args.target_lang,
                              args.batch_frames, audio_files.batch_cap(len(paths)),
                              args.rate_norm_target)
  compile_clock.use_compilation_cache(decoder.config)   # before the first search compiles
  failed = 0
  with output_lib.ResultWriter(args.output, fmt, stages) as writer:
    bar = progress_bar(total=len(paths), desc="translating", unit="file")
    for result in decoder.decode(paths):
      result.pop("index")
      if "error" in result:
        failed += 1
        print(f"skipped {result['error']}", file=sys.stderr, flush=True)
      else:
        writer.write(result)
      bar.update(1)
    bar.close()
  if failed:
    print(f"{failed} of {len(paths)} files could not be decoded (reasons above)",
          file=sys.stderr)
  return 1 if failed else 0


cli = process_setup.command(main)


if __name__ == "__main__":
  cli()
