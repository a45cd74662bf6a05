"""The project's arrows run one way, read from the import statements of every module (those
inside functions too):

  commands (run.py, the package's top-level modules) -> fairseq_checkpoints -> training ->
  evaluation -> schema -> experiment -> model, data, runtime (the analyses above evaluation:
  they read a trained stage as it does)
  multiformer_jax -> data_prep's readers -> multiformer_common
  data_prep.embedded -> multiformer_common;  configs -> multiformer_jax.schema

configs/ holds experiments alone: nothing in the package or in data_prep imports it (the
schema, every key with its default, is multiformer_jax.schema).

multiformer_common (errors, progress, token ids, the package cache) imports nothing of the
project: both sides use it. No module imports itself back through others (no circle).
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(__file__))
PACKAGE = os.path.join(ROOT, "multiformer_jax")
# What each part of multiformer_jax may import from multiformer_jax (besides itself).
ALLOWED = {
    "model": set(),
    "data": set(),
    "runtime": set(),
    "experiment": {"model", "data"},
    "schema": {"model", "data", "runtime", "experiment"},
    "evaluation": {"model", "data", "runtime", "experiment", "schema"},
    "analysis": {"model", "data", "runtime", "experiment", "schema", "evaluation"},
    "training": {"evaluation", "model", "data", "runtime", "experiment", "schema"},
    "fairseq_checkpoints": {"model", "data", "runtime", "experiment", "schema", "training"},
}
COMMANDS = {"train", "evaluate", "translate", "analyze", "ablate", "import_fairseq", "__init__"}
# What each part of the project may import from data_prep ("readers": its modules outside
# common/ and embedded/); none imports configs.
DATA_PREP_ALLOWED = {
    "model": {"common"},
    "runtime": {"common"},
    "experiment": {"common"},
    "schema": {"common", "readers", "embedded"},   # the corpora's names, CorpusSpec's keys
    "data": {"common", "readers"},
    "evaluation": {"common", "readers"},
    "analysis": {"common", "readers"},
    "training": {"common", "readers", "embedded"},
    "fairseq_checkpoints": {"common", "readers"},
    "commands": {"common", "readers"},
}
DATA_PREP_PARTS = {        # data_prep's own parts: what they may import of the project
    "common": set(),
    "readers": {"common", "readers"},
    "embedded": {"common", "embedded"},
}


def import_statements(path: str):
  """(module, names imported from it, or None for `import module`) of every absolute import
  statement in a file."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.module, [a.name for a in node.names]
    elif isinstance(node, ast.Import):
      for alias in node.names:
        yield alias.name, None


def imported_modules(path: str) -> set[str]:
  """The dotted names of every module a file imports (`from a import b` gives a.b as well as
  a, since b may be a module)."""
  names = set()
  for module, imported in import_statements(path):
    names.add(module)
    names.update(f"{module}.{name}" for name in imported or ())
  return names


def package_imports(path: str) -> set[str]:
  """The first-level parts of multiformer_jax that a module imports."""
  return {n.split(".")[1] for n in imported_modules(path)
          if n.startswith("multiformer_jax.") and len(n.split(".")) > 1}


def data_prep_part(dotted: str) -> str:
  """multiformer_common.x -> common (the project's shared core), data_prep.embedded.x ->
  embedded, data_prep.x -> readers."""
  parts = dotted.split(".")
  if parts[0] == "multiformer_common":
    return "common"
  if len(parts) < 2:
    return "readers"
  return "embedded" if parts[1] == "embedded" else "readers"


def project_imports(path: str) -> set[str]:
  """The data_prep parts and configs a module imports."""
  found = set()
  for name in imported_modules(path):
    if name.startswith(("data_prep.", "multiformer_common")):
      found.add(data_prep_part(name))
    elif name.split(".")[0] == "configs":
      found.add("configs")
  return found


def modules(package: str):
  for directory, _, files in os.walk(os.path.join(ROOT, package)):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        part = os.path.relpath(path, os.path.join(ROOT, package)).split(os.sep)[0]
        yield part.removesuffix(".py"), path


@pytest.mark.parametrize("part, path", sorted(modules("multiformer_jax")))
def test_imports_follow_the_arrows(part, path):
  if part in COMMANDS:
    return
  assert part in ALLOWED, f"{path}: a new part of the package; add it to ALLOWED"
  wrong = package_imports(path) - ALLOWED[part] - {part}
  assert not wrong, f"{path} ({part}) imports {sorted(wrong)}; {part} may import " \
                    f"{sorted(ALLOWED[part]) or 'nothing else of the package'}"


@pytest.mark.parametrize("part, path", sorted(modules("multiformer_jax")))
def test_the_package_reads_data_prep_only_below_it(part, path):
  allowed = DATA_PREP_ALLOWED["commands" if part in COMMANDS else part]
  wrong = project_imports(path) - allowed
  assert not wrong, f"{path} ({part}) imports {sorted(wrong)} of data_prep/configs; it may " \
                    f"import {sorted(allowed)}"


@pytest.mark.parametrize("path", sorted(p for _, p in modules("data_prep")))
def test_data_prep_never_imports_upward(path):
  part = data_prep_part(".".join(os.path.relpath(path, ROOT).removesuffix(".py").split(os.sep)))
  names = imported_modules(path)
  upward = sorted(n for n in names if n.split(".")[0] in ("multiformer_jax", "configs"))
  assert not upward, f"{path} imports {upward}: data_prep is below the package and configs"
  wrong = project_imports(path) - DATA_PREP_PARTS[part]
  assert not wrong, f"{path} ({part}) imports data_prep's {sorted(wrong)}; {part} may import " \
                    f"{sorted(DATA_PREP_PARTS[part]) or 'nothing of the project'}"


@pytest.mark.parametrize("path", sorted(p for _, p in modules("multiformer_common")))
def test_the_shared_core_imports_nothing_of_the_project(path):
  """multiformer_common is below both data_prep and multiformer_jax: it imports neither, nor
  configs (only itself)."""
  names = imported_modules(path)
  wrong = sorted(n for n in names if n.split(".")[0] in ("multiformer_jax", "data_prep",
                                                          "configs"))
  assert not wrong, f"{path} imports {wrong}: the shared core imports nothing of the project"


def test_configs_read_only_the_schema_and_each_other():
  """An experiment starts from multiformer_jax.schema (or another experiment) and sets keys;
  it needs nothing else of the project."""
  for name in os.listdir(os.path.join(ROOT, "configs")):
    if name.endswith(".py"):
      names = imported_modules(os.path.join(ROOT, "configs", name))
      wrong = sorted(n for n in names if n.split(".")[0] in ("multiformer_jax", "data_prep")
                     and n not in ("multiformer_jax", "multiformer_jax.schema"))
      assert not wrong, f"configs/{name} imports {wrong}; configs read only " \
                        f"multiformer_jax.schema"


@pytest.mark.parametrize("package", ["multiformer_jax", "data_prep"])
def test_the_package_never_imports_configs(package):
  for _, path in modules(package):
    upward = sorted(n for n in imported_modules(path) if n.split(".")[0] == "configs")
    assert not upward, f"{path} imports {upward}: configs/ holds experiments, which import " \
                       f"the package, not the other way round (the schema: multiformer_jax." \
                       f"schema)"


def _module_graph() -> dict[str, set[str]]:
  """{module: the project modules it imports} over multiformer_jax, data_prep and configs;
  `from a import b` is an edge to a.b where that is a module, else to a."""
  paths = {}
  for package in ("multiformer_jax", "multiformer_common", "data_prep", "configs"):
    for directory, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(directory, name)
          dotted = ".".join(os.path.relpath(path, ROOT).removesuffix(".py").split(os.sep))
          paths[dotted.removesuffix(".__init__")] = path
  graph = {}
  for module, path in paths.items():
    edges = set()
    for imported_module, names in import_statements(path):
      for name in names or [None]:
        submodule = f"{imported_module}.{name}"
        edges.add(submodule if name and submodule in paths else imported_module)
    graph[module] = {e for e in edges if e in paths and e != module}
  return graph


def test_no_module_imports_itself_back_through_others():
  graph = _module_graph()
  assert "multiformer_jax.training.stage" in graph and "data_prep.embedded.voices" in graph
  state, stack = {}, []

  def visit(module):
    state[module] = "open"
    stack.append(module)
    for imported in sorted(graph[module]):
      if state.get(imported) == "open":
        pytest.fail(f"import circle: {' -> '.join(stack[stack.index(imported):] + [imported])}")
      if imported not in state:
        visit(imported)
    stack.pop()
    state[module] = "done"

  for module in sorted(graph):
    if module not in state:
      visit(module)
