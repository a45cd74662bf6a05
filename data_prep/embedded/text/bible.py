"""English-Spanish sentence pairs from two public-domain Bibles, aligned by verse.

Debian packages the SWORD modules: `sword-text-web` (World English Bible, with deuterocanon),
`sword-text-kjv` (King James Version) and `sword-text-sparv` (Reina-Valera 1909). They are
fetched when the corpus is built (`multiformer_common.packages`, no root), never committed, and
read with `pysword`. A pair is an English verse and the Spanish verse of the same book, chapter and
verse number, walked over the Spanish module's books (KJV versification, which the English
modules share for these books but for a few verse boundaries).

A verse becomes a pair when both sides are one to a few sentences a speaker would read: at most
`max_words` English words, ending in sentence punctuation, no verse-number or bracket residue.
Markup (Strong's numbers, footnotes, quotation tags) is removed, typography normalised as
Ding's, and words printed in capitals (RV1909's chapter openings, "ENTONCES el rey", its
"JEHOVÁ" and "JAH", inscriptions) take the form the rest of the Bible gives them. The same
English text (repeated verses, "And the LORD spake unto Moses, saying,") is kept once.
"""

from __future__ import annotations

import collections
import json
import os
import re

from multiformer_common.errors import InvalidValue
from multiformer_common import atomic, packages
from data_prep.embedded.text import ding

ENGLISH = {"web": ("sword-text-web", "engWEB2015eb"), "kjv": ("sword-text-kjv", "engKJV2006eb")}
SPANISH = ("sword-text-sparv", "spaRV1909eb")
MODULES = os.path.join("usr", "share", "sword")
DOMAIN = "bible"
_NOTE = re.compile(r"<note\b.*?</note>", re.S)
_TAG = re.compile(r"<[^>]+>")
_SENTENCE_END = re.compile(r"[.!?]['\"]?$")
_UNWANTED = re.compile(r"[\[\]{}<>/\\|\d@#%&*_=+~^$¶]")
# Reina-Valera 1909 accents the one-letter words ("á su Hijo", "y ó"); today's Spanish does not.
_OLD_ACCENTS = re.compile(r"\b([áéóú])\b")
_PLAIN = {"á": "a", "é": "e", "ó": "o", "ú": "u"}
_WORD = re.compile(r"[^\W\d_]+")
# The WEB heads each stanza of Psalm 119 with its Hebrew letter ("ALEPH Blessed are ..."); the
# Spanish verse has no such heading.
_ACROSTIC_HEADING = re.compile(
    r"^(?:ALEPH|BETH|GIMEL|DALETH|HE|VAV|ZAYIN|HETH|TETH|YODH|KAPH|KAPF|LAMEDH|MEM|NUN|SAMEKH|"
    r"AYIN|PE|TZADHE|QOPH|RESH|SHIN|SIN|TAV|TAW) (?=[A-Z])")


class BibleUnavailable(packages.PackageUnavailable):
  """A Bible module could not be fetched or read here."""


def clean(markup: str) -> str:
  """A verse's OSIS markup -> its text: footnotes dropped (a space in their place), other tags
  removed, paragraph marks dropped, typography normalised."""
  text = _TAG.sub("", _NOTE.sub(" ", markup)).replace("¶", " ")
  text = _OLD_ACCENTS.sub(lambda m: _PLAIN[m.group(1)], text)
  return ding.normalise(text)


# Spanish characters per English one outside these bounds: RV1909 joined or split verses
# where the English version does not (e.g. WEB's 2 Cor 13:13 against RV1909's 13:13-14);
# 99 % of the verse pairs lie within 0.67-1.46.
LENGTH_RATIO = (0.5, 2.0)


def usable(english: str, spanish: str, max_words: int) -> bool:
  """A verse a speaker reads as whole sentences: 3 to max_words English words ending in
  sentence punctuation (the Spanish verse may end in a colon or semicolon where the English
  one closes its sentence), capitalised, no digits or markup residue on either side, and of a
  length that says it is the same verse (LENGTH_RATIO)."""
  words = len(english.split())
  ratio = len(spanish) / max(len(english), 1)
  return (3 <= words <= max_words and len(spanish.split()) >= 2 and
          LENGTH_RATIO[0] <= ratio <= LENGTH_RATIO[1] and
          bool(_SENTENCE_END.search(english)) and spanish[-1:] in ".!?:;\"'" and
          all(not _UNWANTED.search(t) and t.lstrip('¿¡"\'')[:1].isupper()
              for t in (english, spanish)))


def fetch_modules(english: str, cache_dir: str) -> str:
  """The SWORD data folder holding the English version's and the Spanish module (fetched into
  cache_dir if not there yet); BibleUnavailable says what is missing."""
  if english not in ENGLISH:
    raise InvalidValue(f"English Bible {english!r}; valid: {sorted(ENGLISH)}")
  names = [ENGLISH[english][0], SPANISH[0]]
  try:
    roots = packages.fetch_all(names, cache_dir)
  except packages.PackageUnavailable as error:
    raise BibleUnavailable(f"{error}; the Bible text comes from Debian's {' and '.join(names)}"
                           f" packages") from error
  # One SWORD data folder (mods.d + modules) holding both: links into each package's files.
  merged = os.path.join(cache_dir, f"sword-{english}-sparv")
  if not os.path.isdir(merged):
    staging = merged + ".tmp"
    os.makedirs(os.path.join(staging, "mods.d"), exist_ok=True)
    os.makedirs(os.path.join(staging, "modules", "texts", "ztext"), exist_ok=True)
    for root in roots.values():
      sword = os.path.join(root, MODULES)
      for name in os.listdir(os.path.join(sword, "mods.d")):
        _link(os.path.join(sword, "mods.d", name), os.path.join(staging, "mods.d", name))
      texts = os.path.join(sword, "modules", "texts", "ztext")
      for name in os.listdir(texts):
        _link(os.path.join(texts, name), os.path.join(staging, "modules", "texts", "ztext", name))
    os.replace(staging, merged)
  return merged


def _link(source: str, target: str):
  if not os.path.lexists(target):
    os.symlink(os.path.abspath(source), target)


def verse_pairs(sword_dir: str, english: str = "web") -> list[tuple[str, str, str]]:
  """[(reference 'book chapter:verse', English text, Spanish text)] of every verse both modules
  have, in canonical order, cleaned (not yet filtered)."""
  try:
    from pysword.modules import SwordModules  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    raise BibleUnavailable("the Bible source needs pysword (pip install pysword)") from error
  modules = SwordModules(sword_dir)
  modules.parse_modules()
  english_bible = modules.get_bible_from_module(ENGLISH[english][1])
  spanish_bible = modules.get_bible_from_module(SPANISH[1])
  english_books = {b.osis_name for books in english_bible.get_structure().get_books().values()
                   for b in books}
  pairs = []
  for books in spanish_bible.get_structure().get_books().values():
    for book in books:
      if book.osis_name not in english_books:
        continue
      for chapter, verses in enumerate(book.chapter_lengths, 1):
        for verse in range(1, verses + 1):
          raw = [bible.get(books=[book.osis_name], chapters=[chapter], verses=[verse],
                           clean=False) for bible in (english_bible, spanish_bible)]
          pairs.append((f"{book.osis_name} {chapter}:{verse}", clean(raw[0]), clean(raw[1])))
  return pairs


def sentence_pairs(sword_dir: str, english: str = "web", max_words: int = 20
                   ) -> list[tuple[str, str]]:
  """Distinct (English, Spanish) pairs of usable verses (`usable`), each English text once."""
  return filtered_pairs(verse_pairs(sword_dir, english), max_words)


def casing_table(texts) -> dict[str, str]:
  """A word in capitals -> its most frequent form not in capitals among `texts`."""
  counts = collections.Counter(word for text in texts for word in _WORD.findall(text)
                               if not word.isupper())
  table = {}
  for word, _ in counts.most_common():
    table.setdefault(word.upper(), word)
  return table


def truecase(text: str, table: dict[str, str]) -> str:
  """Words of two or more letters in capitals -> their form in `table` (capitalised where it
  has none, and where the word opens the text)."""
  first = _WORD.search(text)

  def usual(match):
    word = match.group(0)
    if len(word) < 2 or not word.isupper():
      return word
    word = table.get(word, word.capitalize())
    return word[0].upper() + word[1:] if match.start() == first.start() else word
  return _WORD.sub(usual, text)


def filtered_pairs(verses, max_words: int) -> list[tuple[str, str]]:
  """(English, Spanish) of the usable verses of [(reference, English, Spanish)], truecased
  (`truecase`, each side's words in capitals as the whole of its text has them), each English
  text once (the first)."""
  tables = [casing_table(v[side] for v in verses) for side in (1, 2)]
  seen, pairs = set(), []
  for _, en, es in verses:
    en, es = truecase(_ACROSTIC_HEADING.sub("", en), tables[0]), truecase(es, tables[1])
    if en not in seen and usable(en, es, max_words):
      seen.add(en)
      pairs.append((en, es))
  return pairs


def cached_sentence_pairs(cache_dir: str, english: str = "web", max_words: int = 20
                          ) -> list[tuple[str, str]]:
  """sentence_pairs of the modules fetched into cache_dir; the verse pairs are read once (about
  a minute) and kept in cache_dir as JSON."""
  path = os.path.join(cache_dir, f"bible-{english}-sparv-verses.json")
  if not os.path.exists(path):
    verses = verse_pairs(fetch_modules(english, cache_dir), english)
    atomic.write_json(path, verses, ensure_ascii=False)
  with open(path, encoding="utf-8") as f:
    verses = json.load(f)
  return filtered_pairs(verses, max_words)
