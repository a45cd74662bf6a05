"""The error a user's mistake raises: a config value, a flag, a head layout, a path, a missing
corpus, checkpoint or prepared data. Its message names the bad value and what would be valid;
the commands print it alone and exit with status 2 (cli_errors), while any other exception (a
bug, a library's own ValueError) keeps its traceback.

`InvalidValue` is also a ValueError and `MissingInput` also a FileNotFoundError, so code that
catches those (and the tests' `pytest.raises(ValueError)`) sees them as before.
"""

from __future__ import annotations


class UserError(Exception):
  """A mistake of the user's, with a message naming the bad value and what would be valid."""


class InvalidValue(UserError, ValueError):
  """A value the user gave (config key, flag, layout, file content) that cannot be used."""


class MissingInput(UserError, FileNotFoundError):
  """Something the user named or the run needs (a file, corpus, checkpoint, prepared data) is
  not there."""


class ExistingOutput(UserError, FileExistsError):
  """An output the command would write is already there with something else in it."""


class ResourceError(UserError, OSError):
  """The machine cannot do what was asked (disk full, no memory, a directory not writable),
  said with what to change."""
