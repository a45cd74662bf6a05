"""The package's arrows run one way: run.py -> training -> evaluation -> model, data, runtime
(and the analyses beside evaluation). Read from the import statements of every module."""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "multiformer_jax")
# What each part of the package may import from the package (besides itself).
ALLOWED = {
    "model": set(),
    "data": set(),
    "runtime": set(),
    "experiment": {"model", "data"},
    "evaluation": {"model", "data", "runtime", "experiment"},
    "analysis": {"model", "data", "runtime", "experiment"},
    "training": {"evaluation", "model", "data", "runtime", "experiment"},
}
COMMANDS = {"evaluate", "translate", "analyze", "ablate", "import_fairseq", "__init__"}


def package_imports(path: str) -> set[str]:
  """The first-level parts of multiformer_jax that a module imports."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  parts = set()
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.ImportFrom) and node.module:
      names = [node.module] if node.module != "multiformer_jax" else \
          [f"multiformer_jax.{a.name}" for a in node.names]
    elif isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    parts.update(n.split(".")[1] for n in names
                 if n.startswith("multiformer_jax.") and len(n.split(".")) > 1)
  return parts


def modules():
  for directory, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        part = os.path.relpath(path, PACKAGE).split(os.sep)[0].removesuffix(".py")
        yield part, path


@pytest.mark.parametrize("part, path", sorted(modules()))
def test_imports_follow_the_arrows(part, path):
  if part in COMMANDS:
    return
  assert part in ALLOWED, f"{path}: a new part of the package; add it to ALLOWED"
  wrong = package_imports(path) - ALLOWED[part] - {part}
  assert not wrong, f"{path} ({part}) imports {sorted(wrong)}; {part} may import " \
                    f"{sorted(ALLOWED[part]) or 'nothing else of the package'}"
