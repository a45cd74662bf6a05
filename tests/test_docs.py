"""The guide says what is: in README.md and docs/*.md (not the lab notebook, docs/notes/, whose
commands are history) every relative link and #anchor resolves, and every `python -m ...` shown
names a module that exists; a `--config=FILE.py` names a config that exists; every page fits
the page size."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(__file__))
GUIDE = sorted([os.path.join(ROOT, "README.md")] +
               glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
GUIDE = [p for p in GUIDE if os.sep + "notes" + os.sep not in p]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
MODULE = re.compile(r"python3? -m ([A-Za-z_][\w.]*)")
CONFIG = re.compile(r"--config=(configs/[\w./]+\.py)")
EXTERNAL = ("http://", "https://", "mailto:")


def _relative(path: str) -> str:
  return os.path.relpath(path, ROOT)


def anchors(path: str) -> set[str]:
  """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces
  to hyphens."""
  found = set()
  in_code = False
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.startswith("```"):
        in_code = not in_code
      match = re.match(r"#{1,6}\s+(.*)", line)
      if match and not in_code:
        text = match.group(1).strip().lower()
        found.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
  return found


def _links(path: str):
  with open(path, encoding="utf-8") as f:
    text = f.read()
  text = re.sub(r"```.*?```", "", text, flags=re.S)     # code blocks hold no links
  for match in LINK.finditer(text):
    yield match.group(1) or match.group(2)


@pytest.mark.parametrize("path", GUIDE, ids=_relative)
def test_every_relative_link_and_anchor_resolves(path):
  broken = []
  for target in _links(path):
    if target.startswith(EXTERNAL):
      continue
    file_part, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part \
        else path
    if not os.path.exists(resolved):
      broken.append(f"{target}: no {_relative(resolved)}")
    elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
      broken.append(f"{target}: no heading #{anchor} in {_relative(resolved)}")
  assert not broken, f"{_relative(path)}: " + "; ".join(broken)


@pytest.mark.parametrize("path", GUIDE, ids=_relative)
def test_every_module_and_config_shown_exists(path):
  with open(path, encoding="utf-8") as f:
    text = f.read()
  missing = []
  for module in set(MODULE.findall(text)):
    if module in ("pytest", "venv", "pip"):
      continue
    base = os.path.join(ROOT, *module.split("."))
    if not (os.path.exists(base + ".py") or os.path.exists(os.path.join(base, "__main__.py"))):
      missing.append(f"python -m {module}")
  for config in set(CONFIG.findall(text)):
    if not os.path.exists(os.path.join(ROOT, config)):
      missing.append(config)
  assert not missing, f"{_relative(path)} shows what does not exist: {sorted(missing)}"


def test_the_anchor_rule_is_githubs(tmp_path):
  page = tmp_path / "page.md"
  page.write_text("# The embedded corpus: voices\n```\n# not a heading\n```\n"
                  "### Joint CTC/attention decoding (`eval.ctc_weight`, `--ctc_weight`)\n")
  assert anchors(str(page)) == {"the-embedded-corpus-voices",
                                "joint-ctcattention-decoding-evalctc_weight---ctc_weight"}


PAGE_LINES = 250


@pytest.mark.parametrize("path", GUIDE, ids=_relative)
def test_every_guide_page_fits_the_page_size(path):
  """A guide page a reader takes in at once: at most PAGE_LINES lines (detail goes to a page
  of its own, history to docs/notes/)."""
  with open(path, encoding="utf-8") as f:
    lines = sum(1 for _ in f)
  assert lines <= PAGE_LINES, f"{_relative(path)}: {lines} lines, over {PAGE_LINES}"
