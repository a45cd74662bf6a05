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

from multiformer_common import packages

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


class DingUnavailable(packages.PackageUnavailable):
  """The dictionary could not be fetched here (no apt, or the download failed)."""


def normalise(text: str) -> str:
  """Typographic quotes, apostrophes and dashes to ASCII; spaces collapsed."""
  return _SPACE.sub(" ", text.translate(_TYPOGRAPHY)).strip()


def fetch(cache_dir: str) -> str:
  """Path of the dictionary file, fetched into `cache_dir` with apt-get download + dpkg-deb -x
  if it is not there yet. Raises DingUnavailable saying what is missing."""
  try:
    root = packages.fetch(PACKAGE, cache_dir)
  except packages.PackageUnavailable as error:
    raise DingUnavailable(f"{error}; the Ding dictionary comes from Debian's {PACKAGE} "
                          f"package") from error
  return os.path.join(root, DICTIONARY)


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
