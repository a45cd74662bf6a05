"""What a recogniser trained on real speech reads on the embedded corpus's recorded splits: the
reference point for dev-real and tst-real's WER.

PocketSphinx's default US English model (a continuous-density HMM trained on hundreds of hours
of recorded speech by many speakers, its general-English trigram LM and CMUdict; all inside the
`pocketsphinx` wheel: nothing is downloaded at run time) decodes a split of an embedded corpus
build, and the project's own scorer (fairseq's 13a WER, `metrics.corpus_wer`) reads its output.
Not a peer on equal work: it trained on real people, the toolkit's model on synthesizers and one
game's cast. pocketsphinx is not among the project's requirements:

    .venv/bin/pip install pocketsphinx
    python -m benchmarks.real_speech_reference --root data/embedded_en_es --pair en-es \
        --splits dev-real,tst-real --out docs/benchmarks/real_speech_reference.jsonl
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from data_prep import audio, corpora
from multiformer_jax.evaluation import metrics


def decode_split(root: str, pair: str, split: str) -> tuple[list[str], list[str]]:
  """(hypotheses, references) of every segment of `split`, in the segment list's order."""
  from pocketsphinx import Decoder  # pylint: disable=import-outside-toplevel
  decoder = Decoder(samprate=audio.SAMPLE_RATE, logfn=os.devnull)
  hypotheses, references, talk = [], [], (None, None)
  for record in corpora.read_corpora("mustc", root, [pair], split):
    if talk[0] != record.audio_path:
      talk = (record.audio_path, audio.load_audio(record.audio_path)[0])
    samples = audio.cut_segment(talk[1], record.offset, record.duration)
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype(np.int16)
    decoder.start_utt()
    decoder.process_raw(pcm.tobytes(), full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    hypotheses.append(hypothesis.hypstr if hypothesis else "")
    references.append(record.source_text)
  return hypotheses, references


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--root", required=True, help="an embedded corpus build (data.root)")
  parser.add_argument("--pair", default="en-es")
  parser.add_argument("--splits", default="dev-real,tst-real")
  parser.add_argument("--out", required=True, help="JSON lines, one per split")
  args = parser.parse_args(argv)
  with open(args.out, "w", encoding="utf-8") as out:
    for split in args.splits.split(","):
      hypotheses, references = decode_split(args.root, args.pair, split)
      wer = metrics.corpus_wer(hypotheses, references)
      row = {"split": split, "recogniser": "pocketsphinx en-us (its wheel's model and LM)",
             "utterances": len(references), **wer,
             "examples": [{"reference": r, "hypothesis": h}
                          for r, h in list(zip(references, hypotheses))[:10]]}
      out.write(json.dumps(row) + "\n")
      print(f"{split}: WER {wer['wer']:.2f} ({len(references)} utterances)")


if __name__ == "__main__":
  main()
