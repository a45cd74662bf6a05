"""Trains (and optionally evaluates) an experiment from its config: `python run.py` and the
console script `multiformer-train`, the same command (absl flags: --config=FILE.py and
--config.a.b=v overrides, as ml_collections configs are given).

    python run.py --config=configs/s2t_v2.py --workdir=runs/v2
    multiformer-train --config=configs/s2t_v2.py:runlocal --workdir=runs/v2_tiny \
        --config.asr.max_updates=200 --config.data.prepared_dir=data/prepared/embedded_en_de

Rerunning the same command resumes where the run stopped. On SIGTERM the run saves a checkpoint
after the current update and exits with status 143; rerun the same command to resume.

Its flags are absl's because ml_collections' config overrides (`--config.a.b=v`) exist only as
absl flags; the other commands keep argparse: absl flags are global to a process, and those
commands' modules are imported by one another (ablate runs evaluation), where their options
would collide. The training itself (stages, loop, steps) is multiformer_jax/training/train.py.
"""

import json
import logging
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory of checkpoints, logs, results")
_COORDINATOR = flags.DEFINE_string(
    "coordinator", None, "multi-process training: host:port of process 0 (with "
    "--num_processes and --process_id); every process runs the same command")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "multi-process: how many")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "multi-process: this process, 0-based")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "multi-process with the cluster's settings detected by "
    "jax.distributed.initialize() (SLURM, Open MPI, Cloud TPU)")
flags.mark_flags_as_required(["config", "workdir"])


def initialize_distributed(jax):
  """jax.distributed.initialize from the flags (CPU processes talk through gloo)."""
  explicit = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise app.UsageError("--coordinator, --num_processes and --process_id go together; got "
                           f"{explicit}")
    if not 0 <= _PROCESS_ID.value < _NUM_PROCESSES.value:
      raise app.UsageError(f"--process_id={_PROCESS_ID.value} must be in [0, "
                           f"{_NUM_PROCESSES.value})")
  elif not _DISTRIBUTED.value:
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if explicit[0]:
    jax.distributed.initialize(*explicit)
  else:
    jax.distributed.initialize()


def main(argv):
  del argv
  import jax  # pylint: disable=import-outside-toplevel
  from multiformer_jax.training import train  # after flag parsing: imports JAX
  from multiformer_jax.runtime.train_log import setup_logging
  from multiformer_jax.runtime import faults  # pylint: disable=import-outside-toplevel
  from multiformer_jax.runtime import compile_clock  # pylint: disable=import-outside-toplevel
  initialize_distributed(jax)
  setup_logging()
  compile_clock.use_compilation_cache(_CONFIG.value)
  try:
    results = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except faults.Preempted as stopped:
    logging.getLogger("multiformer_jax").warning("%s", stopped)
    sys.exit(faults.PREEMPTED_EXIT_CODE)
  if jax.process_index() != 0:
    return
  print(json.dumps(results, indent=1, ensure_ascii=False))
  if any("eval" in r for r in results.values()):
    from multiformer_jax import ablate  # pylint: disable=import-outside-toplevel
    from multiformer_jax.training import curves  # pylint: disable=import-outside-toplevel
    splits = train.evaluated_splits(_CONFIG.value)
    rows = [ablate.collect_row(_WORKDIR.value, f"{_CONFIG.value.name} {split}", split=split)
            for split in splits]
    md_path, _ = ablate.write_table(rows, _WORKDIR.value)
    with open(md_path, encoding="utf-8") as f:
      print(f.read())
    for split in splits:
      shown = curves.examples(_WORKDIR.value, split)
      if shown:
        print(f"{len(shown)} {split} examples (reference, then hypothesis):\n"
              f"{curves.format_examples(shown)}")


def check_config_overrides(argv):
  """An unknown `--config.a.b` key is named with the keys that exist there, exit status 2
  (ml_collections would raise a bare AttributeError while parsing the flags)."""
  from data_prep.common import cli_errors  # pylint: disable=import-outside-toplevel
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if spec is None or not any(a.startswith("--config.") for a in argv):
    return
  try:
    config = cli_errors.load_config_file(spec)
  except Exception:  # pylint: disable=broad-except  # absl reports a bad config file itself
    return
  problems = cli_errors.unknown_config_keys(config, argv)
  if problems:
    cli_errors.exit_with("\n".join(problems))


def run_main(argv):
  from data_prep.common import cli_errors  # pylint: disable=import-outside-toplevel
  cli_errors.report_user_errors(main, argv)


HELP_FLAGS = ("--help", "-h", "--helpshort", "--helpfull", "-?")


def run_app():
  """app.run(run_main); asking for help exits 0 (absl exits 1 after printing it)."""
  try:
    app.run(run_main)
  except SystemExit as done:
    if done.code == 1 and any(a in HELP_FLAGS for a in sys.argv[1:]):
      sys.exit(0)
    raise


def cli():
  """The command: unknown config keys named, tcmalloc and huge pages set up (the process
  re-executes itself once for them), the XLA flags, then absl's app."""
  check_config_overrides(sys.argv[1:])
  from multiformer_jax.runtime import host_memory  # re-executes with huge pages where that helps
  host_memory.fetch_tcmalloc()   # once into the user's cache, where the system has no tcmalloc
  host_memory.set_up_host_allocator()
  from multiformer_jax.runtime.xla_flags import add_default_xla_flags
  add_default_xla_flags()
  run_app()


if __name__ == "__main__":
  cli()
