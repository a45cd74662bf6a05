"""Recordings of a text file's lines by any synthesizer the embedded corpus uses: voices a model
did or did not train on, for `python -m multiformer_jax.translate`.

  python -m data_prep.embedded.speak --engine festival --voices ked_diphone --rate 140-200 \\
      --out recordings/ked sentences.txt

writes `recordings/ked/NNNN.wav` (16 kHz, mono, 16-bit) for line NNNN of the text (counted from
0, so a file's number finds its reference line); blank lines are skipped and counted. Voices are
taken in turn, line by line; a range of rates is drawn per line from --seed. flite, festival,
MBROLA and RHVoice are fetched on first use as the embedded corpus fetches them (docs/data.md).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_common import cli_errors
from data_prep.embedded.voices import (ENGINE_VOICES, ENGINES, Voice, cache_dir as voices_cache,
                                       speak, voice_names, write_wav)


def parse_rate(text: str) -> tuple[int, int]:
  """"170" -> (170, 170); "140-200" -> (140, 200): words a minute."""
  try:
    low, _, high = text.partition("-")
    bounds = int(low), int(high or low)
  except ValueError:
    raise InvalidValue(f"--rate {text!r}; valid: words a minute, one (170) or a range (140-200)")
  if not 80 <= bounds[0] <= bounds[1] <= 450:
    raise InvalidValue(f"--rate {text!r}; valid: 80 <= low <= high <= 450 words a minute")
  return bounds


def check_voices(engine: str, voices: list[str]):
  """A ValueError naming the valid voices of `engine` (espeak-ng's variants are checked when
  spoken)."""
  if engine not in ENGINES:
    raise InvalidValue(f"--engine {engine!r}; valid: {', '.join(ENGINES)}")
  if not voices or not all(voices):
    raise InvalidValue("--voices is empty; give one or more, separated by commas")
  if engine == "espeak":
    return
  valid = voice_names(ENGINE_VOICES[engine])
  for voice in voices:
    if voice not in valid:
      raise InvalidValue(f"{engine} voice {voice!r}; valid: {', '.join(valid)}")


def speak_lines(lines: list[str], out_dir: str, engine: str, voices: list[str],
                rate=(175, 175), pitch: int = 50, seed: int = 0, language: str = "en-us",
                cache_dir: str = "", log=print) -> dict:
  """Writes out_dir/NNNN.wav for each non-blank line; -> {"written": n, "blank": n}."""
  check_voices(engine, voices)
  cache_dir = cache_dir or voices_cache()
  rng = np.random.default_rng(seed)
  os.makedirs(out_dir, exist_ok=True)
  counts = {"written": 0, "blank": 0}
  for number, line in enumerate(lines):
    if not line.strip():
      counts["blank"] += 1
      continue
    voice = Voice(language, voices[number % len(voices)],
                  int(rng.integers(rate[0], rate[1] + 1)), pitch, engine)
    write_wav(os.path.join(out_dir, f"{number:04d}.wav"), speak(line.strip(), voice, cache_dir))
    counts["written"] += 1
  log(f"{counts['written']} recordings in {out_dir} ({engine}: {', '.join(voices)}); "
      f"{counts['blank']} blank lines skipped")
  return counts


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("text", help="a UTF-8 text file, one utterance a line")
  parser.add_argument("--out", required=True, help="folder for NNNN.wav")
  parser.add_argument("--engine", default="espeak",
                      help=f"one of {', '.join(ENGINES)}")
  parser.add_argument("--voices", required=True,
                      help="comma-separated, taken in turn: espeak-ng variants (m3, f2, ...), "
                           "flite's kal16/awb/rms/slt, festival's kal_diphone/ked_diphone, "
                           "MBROLA's us1/us2/us3/en1/..., RHVoice's bdl/clb/alan/...")
  parser.add_argument("--rate", default="175", help="words a minute: 170, or 140-200 per line")
  parser.add_argument("--pitch", type=int, default=50,
                      help="0-99, 50 = the voice's own (festival: not used)")
  parser.add_argument("--seed", type=int, default=0, help="draws the rates of a range")
  parser.add_argument("--language", default="en-us", help="espeak-ng voice (espeak only)")
  args = parser.parse_args(argv)
  with open(args.text, encoding="utf-8") as f:
    lines = f.read().splitlines()
  speak_lines(lines, args.out, args.engine, args.voices.split(","), parse_rate(args.rate),
              args.pitch, args.seed, args.language)


cli = cli_errors.command_line_entry(main)

if __name__ == "__main__":
  cli()
