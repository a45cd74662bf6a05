"""One set-up of a command's process, however it is started (`python -m ...`, a console
script, run.py): host memory (tcmalloc and huge pages: the process re-executes itself once,
runtime/host_memory.py), then XLA's default flags (runtime/xla_flags.py), both before JAX
starts."""

from __future__ import annotations

from multiformer_jax.runtime import host_memory, xla_flags


def set_up(fetch_tcmalloc: bool = False):
  """Sets the process up; `fetch_tcmalloc`: first unpack Debian's tcmalloc into the user's
  cache where the system has none (the training command does; the others use it once there)."""
  if fetch_tcmalloc:
    host_memory.fetch_tcmalloc()
  host_memory.set_up_host_allocator()
  xla_flags.add_default_xla_flags()


def command(cli):
  """A command-line entry `cli()` -> the same entry with the process set up first: what the
  console script and `python -m` both run."""
  def entry():
    set_up()
    return cli()
  entry.__doc__ = f"{cli.__doc__ or cli.__name__}\n\nThe process is set up first " \
                  f"(runtime/process_setup.py)."
  entry.sets_up_process = True
  return entry
