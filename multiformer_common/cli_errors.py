"""How the command-line tools report an error the user caused (a config value, a flag, a path,
a missing corpus, checkpoint or prepared data): the message alone on stderr and exit status 2,
as usage errors are reported by argparse and absl, instead of a Python traceback.

These are the exceptions of errors.UserError (InvalidValue, MissingInput, ExistingOutput,
ResourceError and their kinds: ConfigError, LayoutError, CorpusLayoutError, ...), raised with a
message that names the bad value and what would be valid. Any other exception, a library's own
ValueError or OSError included, is a bug or an unforeseen failure and keeps its traceback.
MULTIFORMER_TRACEBACK=1 shows the traceback of a user error too.
"""

from __future__ import annotations

import os
import sys

from multiformer_common.errors import UserError

USER_ERRORS = (UserError,)
USER_ERROR_EXIT = 2
TRACEBACK_ENV = "MULTIFORMER_TRACEBACK"


def report_user_errors(function, *args, **kwargs):
  """function(*args, **kwargs); a user error exits with its message and status 2."""
  try:
    return function(*args, **kwargs)
  except USER_ERRORS as error:
    if not _reported(error):
      raise
    exit_with(str(error) or type(error).__name__, type(error).__name__)


def exit_status(error: BaseException) -> int:
  """The status a command ends with when `error` escapes it: a user error's (see
  report_user_errors), else Python's for an uncaught exception."""
  return USER_ERROR_EXIT if _reported(error) else 1


def _reported(error: BaseException) -> bool:
  """Whether report_user_errors ends the command with `error`'s message alone (else it keeps
  its traceback)."""
  return isinstance(error, USER_ERRORS) and not os.environ.get(TRACEBACK_ENV)


def command_line_entry(main):
  """-> cli(): main() (an argparse main reading sys.argv) with user errors reported."""
  def cli():
    report_user_errors(main)
  cli.__doc__ = f"{main.__module__} on the command line; user errors exit with status 2."
  return cli


def exit_with(message: str, kind: str = ""):
  """Prints the message (with the exception's kind, if any) and exits with status 2."""
  hint = f"\n({kind}; {TRACEBACK_ENV}=1 shows the traceback)" if kind else ""
  print(f"error: {message}{hint}", file=sys.stderr)
  sys.exit(USER_ERROR_EXIT)


def unknown_config_keys(config, argv) -> list[str]:
  """The `--config.a.b=v` overrides in argv whose key path `config` lacks, each with the keys
  that exist where it fails."""
  problems = []
  for arg in argv:
    if not arg.startswith("--config.") or "=" not in arg:
      continue
    path = arg[len("--config."):].split("=", 1)[0].split(".")
    node = config
    for depth, part in enumerate(path):
      keys = list(node.keys()) if hasattr(node, "keys") else []
      if part not in keys:
        where = ".".join(path[:depth]) or "the config"
        problems.append(f"--config.{'.'.join(path)}: {where} has no key {part!r}; its keys: "
                        f"{', '.join(sorted(keys)) or '(none: it is a value)'}")
        break
      node = node[part]
  return problems


def load_config_file(spec: str):
  """The config that `--config=FILE[:ARG]` names (ml_collections' config_flags semantics)."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_multiformer_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()
