"""German-English example sentences from the Ding dictionary (Debian's `trans-de-en`).

Ding's entries pair German and English alternatives slot by slot:
`German | Beispiel eins. | Beispiel zwei. :: English | example one. | example two.`
Slots that are whole sentences on both sides (sentence-final punctuation, 3 to 25 English words,
no brackets, digits, slashes or abbreviations) become sentence pairs, e.g. "It was no picnic."
/ "Es war kein Vergnügen.". The package (GPL, ~6 MB) is fetched when the corpus is built,
never committed: `apt-get download` and `dpkg-deb -x` into a cache, which needs no root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

PACKAGE = "trans-de-en"
DICTIONARY = os.path.join("usr", "share", "trans", "de-en")
DOMAIN = "ding"
_SENTENCE_END = re.compile(r"[.!?]$")
_UNWANTED = re.compile(r"[()\[\]{}<>/\\|\d@#%&*_=+~^$]|\.\.|…|\b[A-Za-z]\.[A-Za-z]\.")
# What speech cannot carry, written the same way in every split.
_TYPOGRAPHY = str.maketrans({"’": "'", "‘": "'", "‚": "'", "´": "'", "`": "'", "“": '"',
                             "”": '"', "„": '"', "«": '"', "»": '"', "–": "-", "—": "-",
                             "\u00a0": " "})
_SPACE = re.compile(r"\s+")


class DingUnavailable(RuntimeError):
  """The dictionary could not be fetched here (no apt, or the download failed)."""


def normalise(text: str) -> str:
  """Typographic quotes, apostrophes and dashes to ASCII; spaces collapsed."""
  return _SPACE.sub(" ", text.translate(_TYPOGRAPHY)).strip()


def fetch(cache_dir: str) -> str:
  """Path of the dictionary file, fetched into `cache_dir` with apt-get download + dpkg-deb -x
  if it is not there yet. Raises DingUnavailable saying what is missing."""
  path = os.path.join(cache_dir, PACKAGE, DICTIONARY)
  if os.path.exists(path):
    return path
  missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
  if missing:
    raise DingUnavailable(f"{' and '.join(missing)} not found: the Ding dictionary comes from "
                          f"Debian's {PACKAGE} package (apt-get download {PACKAGE}; dpkg-deb "
                          f"-x it into {os.path.join(cache_dir, PACKAGE)})")
  os.makedirs(cache_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=cache_dir) as work:
    download = subprocess.run(["apt-get", "download", PACKAGE], cwd=work, capture_output=True,
                              text=True)
    debs = [f for f in os.listdir(work) if f.endswith(".deb")]
    if download.returncode or not debs:
      raise DingUnavailable(f"apt-get download {PACKAGE} failed ({download.stderr.strip()[-300:]}"
                            f"); run 'apt-get update' first, or install {PACKAGE}")
    unpacked = os.path.join(work, "unpacked")
    subprocess.run(["dpkg-deb", "-x", os.path.join(work, debs[0]), unpacked], check=True,
                   capture_output=True)
    os.replace(unpacked, os.path.join(cache_dir, PACKAGE))
  return path


def _first_variant(slot: str) -> str:
  """A slot may list variants separated by ';' (pairing across them is unknown): the first."""
  return slot.split(";")[0].strip()


def _usable(english: str, german: str) -> bool:
  words = len(english.split())
  return (3 <= words <= 25 and len(german.split()) >= 2 and
          all(_SENTENCE_END.search(t) and not _UNWANTED.search(t) and t[0].isupper()
              for t in (english, german)))


def parse_line(line: str) -> list[tuple[str, str]]:
  """(english, german) sentence pairs of one dictionary line."""
  if line.startswith("#") or " :: " not in line:
    return []
  german, english = line.rstrip("\n").split(" :: ", 1)
  german_slots, english_slots = german.split(" | "), english.split(" | ")
  if len(german_slots) != len(english_slots):
    return []
  pairs = []
  for de, en in zip(german_slots, english_slots):
    de, en = normalise(_first_variant(de)), normalise(_first_variant(en))
    if _usable(en, de):
      pairs.append((en, de))
  return pairs


def sentence_pairs(path: str) -> list[tuple[str, str]]:
  """Distinct (english, german) pairs in dictionary order; an English sentence is kept once."""
  seen, pairs = set(), []
  with open(path, encoding="utf-8") as f:
    for line in f:
      for english, german in parse_line(line):
        if english not in seen:
          seen.add(english)
          pairs.append((english, german))
  return pairs
