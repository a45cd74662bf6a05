"""One set-up of a command's process, however it is started (`python -m multiformer_jax.X`, the
console script `multiformer-X`, run.py): host memory (tcmalloc, unpacked into the user's cache
where the system has none, and huge pages: the process re-executes itself once,
runtime/host_memory.py), then XLA's default flags (runtime/xla_flags.py), both before JAX
starts, and the exit handler that stops a multi-process run's peer watch after JAX's own
(runtime/peers.py); then the command, whose user errors end with their message and exit status 2
(multiformer_common/cli_errors.py).

Every command module at the package's top level (train, evaluate, translate, analyze, ablate,
import_fairseq) ends with `cli = process_setup.command(main)` and `if __name__ == "__main__":
cli()`; its console script is that same `cli`.
"""

from __future__ import annotations

import atexit
import sys

from multiformer_common import cli_errors
from multiformer_jax.runtime import host_memory, peers, xla_flags


def set_up():
  """Sets the process up (may re-execute it once, with the same arguments)."""
  host_memory.fetch_tcmalloc()
  host_memory.set_up_host_allocator()
  xla_flags.add_default_xla_flags()
  # Before JAX is imported: exit handlers run last-registered first, so the watches of a
  # multi-process run are stopped after JAX's own handler has shut its client down.
  atexit.register(peers.stop_all)


def command(main):
  """`main(argv=None) -> exit status or None` -> `cli()`: the process set up, then main with
  user errors reported, exiting with main's status (0 for None)."""
  def cli():
    set_up()
    sys.exit(cli_errors.report_user_errors(main) or 0)
  cli.__doc__ = f"{main.__module__} on the command line (runtime/process_setup.py)."
  cli.sets_up_process = True
  return cli
