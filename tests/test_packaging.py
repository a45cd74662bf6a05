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


def _main_block(path: str) -> list[str]:
  """The statements of a module's `if __name__ == "__main__":` block, as source."""
  import ast  # pylint: disable=import-outside-toplevel
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
      return [ast.unparse(statement) for statement in node.body]
  return []


COMMANDS = ("evaluate", "translate", "analyze", "ablate", "import_fairseq")


def test_every_command_sits_at_the_package_top_and_sets_its_process_up_one_way():
  """Each command of the package is multiformer_jax/NAME.py: its console script is that
  module's `cli`, which its `python -m` form runs and nothing else, and which sets the process
  up first (runtime/process_setup.py: allocator, XLA flags; the same set_up for train, whose
  absl flags need their own app) and reports user errors."""
  import inspect  # pylint: disable=import-outside-toplevel
  from multiformer_jax import train  # pylint: disable=import-outside-toplevel
  scripts = _pyproject()["project"]["scripts"]
  for command in COMMANDS:
    name = "multiformer-" + command.replace("_", "-")
    assert scripts[name] == f"multiformer_jax.{command}:cli", name
    path = f"multiformer_jax/{command}.py"
    assert _main_block(path) == ["cli()"], path
    assert importlib.import_module(f"multiformer_jax.{command}").cli.sets_up_process, path
  assert scripts["multiformer-train"] == "multiformer_jax.train:cli"
  assert "process_setup.set_up()" in inspect.getsource(train.cli)
  assert _main_block("multiformer_jax/train.py") == ["cli()"]
  assert _main_block("run.py") == ["cli()"]


def test_library_modules_hold_no_command_line():
  """argparse parsers, absl flags and `__main__` blocks are the commands' alone (the package's
  top-level modules); every module below them is library code a notebook can import."""
  for directory, _, files in os.walk(os.path.join(REPO, "multiformer_jax")):
    for name in files:
      path = os.path.relpath(os.path.join(directory, name), REPO)
      if not name.endswith(".py") or os.path.dirname(path) == "multiformer_jax":
        continue
      with open(os.path.join(REPO, path), encoding="utf-8") as f:
        text = f.read()
      assert "ArgumentParser" not in text and "absl import flags" not in text, path
      assert not _main_block(path), path


def test_the_gpu_install_is_one_command_that_the_guide_shows():
  """requirements-gpu.txt replaces jax and jaxlib alone (one release for both, with its CUDA
  plugin); its install line is the one docs/cluster.md gives."""
  with open(os.path.join(REPO, "requirements-gpu.txt"), encoding="utf-8") as f:
    text = f.read()
  pins = [line for line in text.splitlines() if line and not line.startswith("#")]
  names = {pin.split("==")[0] for pin in pins}
  assert names == {"jax[cuda13]", "jaxlib"}
  assert len({pin.split("==")[1] for pin in pins}) == 1
  command = "pip install -q -r requirements.txt && .venv/bin/pip install -q -r " \
            "requirements-gpu.txt"
  assert command in text
  with open(os.path.join(REPO, "docs", "cluster.md"), encoding="utf-8") as f:
    assert command in f.read()
