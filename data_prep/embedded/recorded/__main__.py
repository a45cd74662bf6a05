"""What the recorded-speech readers find in the three games: linked / left-out counts with their
reasons, hours, and the speaking rates (characters per second) that show the links hold.

    python -m data_prep.embedded.recorded [--sample 400]
"""

from __future__ import annotations

import argparse

import numpy as np

from multiformer_common import cli_errors, packages
from data_prep.embedded import recorded
from data_prep.embedded.recorded import SAMPLE_RATE, steel_sky


def _rates(lines) -> str:
  rates = [len(line.text) / (len(line.audio) / SAMPLE_RATE) for line in lines]
  p5, p50, p95 = np.percentile(rates, [5, 50, 95])
  return f"characters per second: median {p50:.1f}, 5-95 % {p5:.1f}-{p95:.1f}"


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m data_prep.embedded.recorded",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--sample", type=int, default=400,
                      help="Beneath a Steel Sky lines whose speech is decoded for the rates")
  parser.add_argument("--cache-root", default="", help="the package cache ('' = the default)")
  args = parser.parse_args(argv)
  cache = args.cache_root or packages.cache_root()
  tally = recorded.Tally()
  queen = list(recorded.queen_lines(recorded.game_folder("queen", cache), tally))
  hours = sum(len(line.audio) for line in queen) / SAMPLE_RATE / 3600
  speakers = len({line.speaker for line in queen})
  print(f"Flight of the Amazon Queen: {tally.summary()}\n  {hours:.2f} h, {speakers} speaker "
        f"ids; {_rates(queen)}")
  tally = recorded.Tally()
  with recorded.uqm_archives(cache) as archives:
    uqm = list(recorded.uqm_lines(archives, tally))
  hours = sum(len(line.audio) for line in uqm) / SAMPLE_RATE / 3600
  speakers = len({line.speaker for line in uqm})
  print(f"The Ur-Quan Masters (pages): {tally.summary()}\n  {len(uqm)} utterances, "
        f"{hours:.2f} h, {speakers} races; {_rates(uqm)}")
  tally = recorded.Tally()
  folder = recorded.game_folder("sky", cache)
  sky = recorded.sky_lines(folder, tally)
  picked = np.random.default_rng(0).choice(len(sky), min(args.sample, len(sky)), replace=False)
  disk = steel_sky.Disk(folder)
  sample = [recorded.load_sky_audio(disk, sky[i]) for i in sorted(picked)]
  seconds = np.mean([len(line.audio) for line in sample]) / SAMPLE_RATE
  print(f"Beneath a Steel Sky: {tally.summary()}\n  about {len(sky) * seconds / 3600:.2f} h "
        f"({len(sample)} lines decoded); {_rates(sample)}")


cli = cli_errors.command_line_entry(main)

if __name__ == "__main__":
  cli()
