"""The embedded corpus's text: human-translated sentence pairs, one module per source.

- catalogs: message catalogs (.po) of PyPI wheels, de/es/fr/it/pt <-> English
- ding: the Ding dictionary's German-English example sentences (Debian's trans-de-en)
- bible: verse pairs of an English Bible and Reina-Valera 1909 (Debian's sword-text-*)

`direction_pairs` gathers what a corpus spec asks for in one direction, as (source text,
target text, domain) triples.
"""

from __future__ import annotations

from data_prep.embedded.text import bible, catalogs, ding

TEXT_SOURCES = ("catalogs", "ding", "bible")


def ding_pairs(spec, source: str, target: str, log=print) -> list[tuple]:
  """(source text, target text, 'ding') for a German-English direction of a spec that asks
  for Ding; [] with a warning saying what is missing where the dictionary cannot be fetched."""
  if "ding" not in spec.text or {source, target} != {"en", "de"}:
    return []
  try:
    path = ding.fetch(spec.package_cache())
  except ding.DingUnavailable as error:
    log(f"WARNING: the embedded corpus is built without the Ding sentences ({error}); it has "
        f"the message catalogs' sentences only, too few for the model to generalise")
    return []
  return [(en, de, ding.DOMAIN) if source == "en" else (de, en, ding.DOMAIN)
          for en, de in ding.sentence_pairs(path)]


def bible_pairs(spec, source: str, target: str, log=print) -> list[tuple]:
  """(source text, target text, 'bible') for an English-Spanish direction of a spec that asks
  for the Bible; [] with a warning saying what is missing where it cannot be fetched."""
  if "bible" not in spec.text or {source, target} != {"en", "es"}:
    return []
  try:
    pairs = bible.cached_sentence_pairs(spec.package_cache(), spec.bible_english,
                                        spec.bible_max_words)
  except bible.BibleUnavailable as error:
    log(f"WARNING: the embedded corpus is built without the Bible verses ({error}); it has "
        f"the message catalogs' sentences only, too few for the model to generalise")
    return []
  return [(en, es, bible.DOMAIN) if source == "en" else (es, en, bible.DOMAIN)
          for en, es in pairs]


def catalog_wheels(spec) -> dict[str, str]:
  """{domain: wheel path} of the message catalogs ({} where spec.text has no "catalogs")."""
  if "catalogs" not in spec.text:
    return {}
  return catalogs.download_wheels(catalogs.wheel_cache(spec.package_cache()))


def direction_pairs(spec, source: str, target: str, wheels: dict[str, str],
                    extra_pairs=()) -> list[tuple]:
  """(source text, target text, domain) of one direction: the catalogs' pairs of `wheels`,
  then `extra_pairs` (ding_pairs, bible_pairs) whose source text the catalogs do not have."""
  pairs = []
  for domain, wheel in sorted(wheels.items()):
    language = source if source != "en" else target
    for english, translated in catalogs.sentence_pairs(wheel, language):
      pairs.append((english, translated, domain) if source == "en" else
                   (translated, english, domain))
  seen = {p[0] for p in pairs}
  pairs += [p for p in extra_pairs if p[0] not in seen]
  if not pairs:
    raise catalogs.TextSourceError(f"no sentence pairs for {source}-{target}")
  return pairs
