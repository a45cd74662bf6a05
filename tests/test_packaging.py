"""pyproject.toml: the console scripts point at real command-line entry points, the packages
it installs exist, and its dependencies are requirements.txt's pins."""

import importlib
import os
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject():
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


def test_console_scripts_resolve_to_the_command_line_entries():
  scripts = _pyproject()["project"]["scripts"]
  assert set(scripts) == {"multiformer-train", "multiformer-evaluate", "multiformer-analyze", "multiformer-ablate",
                          "multiformer-translate", "multiformer-prepare",
                          "multiformer-embedded-corpus", "multiformer-import-fairseq",
                          "multiformer-speak"}
  for name, target in scripts.items():
    module, function = target.split(":")
    assert function == "cli", name        # main() with user errors reported (exit status 2)
    entry = getattr(importlib.import_module(module), function)
    assert callable(entry) and entry.__code__.co_argcount == 0, name


def test_packages_and_dependencies():
  project = _pyproject()
  for package in ("multiformer_jax", "data_prep", "configs"):   # regular packages: found
    assert os.path.exists(os.path.join(REPO, package, "__init__.py")), package
  assert project["tool"]["setuptools"]["dynamic"]["dependencies"]["file"] == [
      "requirements.txt"]


def test_the_cpu_kernels_sources_ship_with_the_package():
  """Every source and local header cpu_kernels.py compiles matches the package data, and the
  sources include no local header it does not key its cache on."""
  import fnmatch
  import re

  from multiformer_jax.model.attention import cpu_kernels
  globs = _pyproject()["tool"]["setuptools"]["package-data"]["multiformer_jax.model.attention"]
  for name in cpu_kernels.SOURCES + cpu_kernels.HEADERS:
    assert any(fnmatch.fnmatch(f"cpu/{name}", pattern) for pattern in globs), name
  for name in cpu_kernels.SOURCES:
    text = (cpu_kernels.SOURCE_DIR / name).read_text()
    local = {h for h in re.findall(r'#include "([^"]+)"', text) if not h.startswith("xla/")}
    assert local <= set(cpu_kernels.HEADERS), (name, local)
