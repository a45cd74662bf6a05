"""Trains (and optionally evaluates) an experiment from its config: `python run.py` and the
console script `multiformer-train`, the same command (absl flags: --config=FILE.py and
--config.a.b=v overrides, as ml_collections configs are given).

    python run.py --config=configs/s2t_v2.py --workdir=runs/v2
    multiformer-train --config=configs/s2t_v2.py:runlocal --workdir=runs/v2_tiny \
        --config.asr.max_updates=200 --config.data.prepared_dir=data/prepared/embedded_en_de

Rerunning the same command resumes where the run stopped. On SIGTERM, SIGINT or SIGUSR1 the run
saves a checkpoint after the current update and exits with status 128 + the signal's number
(143, 130, 138; runtime/faults.py); rerun the same command to resume.

Its flags are absl's because ml_collections' config overrides (`--config.a.b=v`) exist only as
absl flags; the other commands keep argparse: absl flags are global to a process, and those
commands' modules are imported by one another (ablate runs evaluation), where their options
would collide. The training itself (stages, loop, steps) is multiformer_jax/training/train.py.
"""

import json
import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from multiformer_common import cli_errors
from multiformer_jax.runtime import cluster

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory of checkpoints, logs, results")
_COORDINATOR = flags.DEFINE_string(
    "coordinator", None, "multi-process training: host:port of process 0 (with "
    "--num_processes and --process_id); every process runs the same command")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "multi-process: how many")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "multi-process: this process, 0-based")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", None, "multi-process with the cluster's settings: under SLURM (the "
    "default where srun started several tasks) each task joins with every GPU its layout "
    "gives it (runtime/cluster.py); elsewhere jax.distributed.initialize() detects them (Open "
    "MPI, Cloud TPU). --nodistributed: one process per task, each its own run")
_ACCEPT_CHANGES = flags.DEFINE_bool(
    "accept_config_changes", False, "resume a run whose config changed in settings that alter "
    "the model or the data order (refused otherwise, naming them); the changes are logged in "
    "{workdir}/config_changes.jsonl")
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "print the whole experiment, every key with the config file's and "
    "the overrides' values, checked as a run checks it, and exit (no --workdir needed)")
_PEER_TIMEOUT = flags.DEFINE_float(
    "peer_timeout_s", 60.0, "multi-process: a process that gives no sign of life for this "
    "long is taken for dead and the others stop, naming it (runtime/peers.py)")
flags.mark_flags_as_required(["config"])


def initialize_distributed(jax):
  """jax.distributed.initialize from the flags or SLURM's variables (CPU processes talk
  through gloo)."""
  explicit = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise app.UsageError("--coordinator, --num_processes and --process_id go together; got "
                           f"{explicit}")
    if not 0 <= _PROCESS_ID.value < _NUM_PROCESSES.value:
      raise app.UsageError(f"--process_id={_PROCESS_ID.value} must be in [0, "
                           f"{_NUM_PROCESSES.value})")
  elif not (_DISTRIBUTED.value or (_DISTRIBUTED.value is None and cluster.is_slurm() and
                                   int(os.environ["SLURM_NTASKS"]) > 1)):
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # JAX's preemption service would install a C handler of SIGTERM over the run's own (which
  # handles SIGINT and SIGUSR1 too, and agrees on the update to stop at: runtime/faults.py,
  # training/agreement.py); orbax's preemption policy then reads it as never preempted.
  jax.config.update("jax_enable_preemption_service", False)
  if explicit[0]:
    jax.distributed.initialize(*explicit)
  elif cluster.is_slurm():
    jax.distributed.initialize(**cluster.slurm_settings())
  else:
    jax.distributed.initialize()


def print_config(config):
  """The resolved experiment, checked (multiformer_jax.schema), on stdout."""
  from multiformer_jax import schema  # pylint: disable=import-outside-toplevel
  schema.check(config)
  print(config, end="")


def main(argv):
  del argv
  if _PRINT_CONFIG.value:
    print_config(_CONFIG.value)
    return
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required: the run's checkpoints, logs and results go "
                         "there (or pass --print_config to only show the experiment)")
  import jax  # pylint: disable=import-outside-toplevel
  from multiformer_jax.runtime import faults, peers  # pylint: disable=import-outside-toplevel
  with faults.handling_stop_signals():
    watch = None
    status, exit_status = "failed: see its log", 1
    try:
      initialize_distributed(jax)
      if jax.process_count() > 1:
        watch = peers.PeerWatch(_PEER_TIMEOUT.value).start()
      _train(_CONFIG.value, _WORKDIR.value)
      status, exit_status = "finished", 0
    except faults.Stopped as stopped:
      status = f"stopped by {faults.signal_name(stopped.signum)}"
      exit_status = faults.exit_code(stopped.signum)
      logging.getLogger("multiformer_jax").warning("%s", stopped)
      sys.exit(exit_status)
    except Exception as error:  # pylint: disable=broad-except  # told to the peers, raised
      status = f"failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
      exit_status = cli_errors.exit_status(error)
      raise
    finally:
      if watch is not None:
        watch.leave(status, exit_status)


def _train(config, workdir: str):
  import jax  # pylint: disable=import-outside-toplevel
  from multiformer_jax.training import train  # after flag parsing: imports JAX
  from multiformer_jax.runtime.train_log import setup_logging
  from multiformer_jax.runtime import compile_clock  # pylint: disable=import-outside-toplevel
  setup_logging().info("%s", cluster.describe_process(jax))
  compile_clock.use_compilation_cache(config)
  results = train.train_and_evaluate(config, workdir, _ACCEPT_CHANGES.value)
  if jax.process_index() != 0:
    return
  print(json.dumps(results, indent=1, ensure_ascii=False))
  if any("eval" in r for r in results.values()):
    from multiformer_jax.training import curves  # pylint: disable=import-outside-toplevel
    from multiformer_jax.training import results_table  # pylint: disable=import-outside-toplevel
    splits = train.evaluated_splits(config)
    rows = [results_table.collect_row(workdir, f"{config.name} {split}", split=split)
            for split in splits]
    md_path, _ = results_table.write_table(rows, workdir)
    with open(md_path, encoding="utf-8") as f:
      print(f.read())
    for split in splits:
      shown = curves.examples(workdir, split, config)
      if shown:
        print(f"{len(shown)} {split} examples (reference, then hypothesis):\n"
              f"{curves.format_examples(shown)}")


def check_config_overrides(argv):
  """An unknown `--config.a.b` key is named with the keys that exist there, exit status 2
  (ml_collections would raise a bare AttributeError while parsing the flags)."""
  from multiformer_common import cli_errors  # pylint: disable=import-outside-toplevel
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
  """The command: the process set up as every command's (runtime/process_setup.py: it
  re-executes itself once, so before the config file loads JAX), unknown config keys named,
  then absl's app."""
  from multiformer_jax.runtime import process_setup  # pylint: disable=import-outside-toplevel
  process_setup.set_up()
  check_config_overrides(sys.argv[1:])
  run_app()


if __name__ == "__main__":
  cli()
