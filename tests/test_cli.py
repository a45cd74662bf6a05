"""Errors a user causes on the command line: their message and exit status 2, no traceback."""

import os
import re
import subprocess
import sys

import pytest

from configs import quickstart
from multiformer_common import cli_errors
from multiformer_common.errors import InvalidValue

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
  env = {k: v for k, v in os.environ.items() if k != cli_errors.TRACEBACK_ENV}
  return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                        timeout=300, check=False, env=env)


def test_an_unknown_config_key_is_named_with_the_keys_that_exist():
  config = quickstart.get_config()
  assert cli_errors.unknown_config_keys(config, ["--config.asr.lr=1", "--workdir=x"]) == []
  (problem,) = cli_errors.unknown_config_keys(config, ["--config.asr.lrate=1"])
  assert problem.startswith("--config.asr.lrate: asr has no key 'lrate'; its keys: ")
  assert "lr, lr_scheduler" in problem
  (problem,) = cli_errors.unknown_config_keys(config, ["--config.asr.lr.peak=1"])
  assert "asr.lr has no key 'peak'; its keys: (none: it is a value)" in problem
  result = _run("run.py", "--config=configs/quickstart.py", "--workdir=/tmp/unused",
                "--config.trian.seed=3")
  assert result.returncode == cli_errors.USER_ERROR_EXIT
  assert "the config has no key 'trian'" in result.stderr and "train" in result.stderr
  assert "Traceback" not in result.stderr


def test_run_py_re_executes_itself_before_jax_is_imported():
  # The host-memory set-up re-executes the process (runtime/process_setup.py): work done before
  # it is done twice, and loading the config file imports JAX.
  from multiformer_jax.runtime import host_memory  # pylint: disable=import-outside-toplevel
  if host_memory.reexecution_environment() is None:
    pytest.skip("this machine's run.py does not re-execute itself (no huge pages, no tcmalloc)")
  result = _run("-X", "importtime", "run.py", "--config=configs/quickstart.py",
                "--config.train.seed=3", "--print_config")
  assert result.returncode == 0, result.stderr[-2000:]
  starts = re.findall(r"^import time:.*\| encodings$", result.stderr, re.M)
  jax_imports = re.findall(r"^import time:.*\| +jax$", result.stderr, re.M)
  assert (len(starts), len(jax_imports)) == (2, 1)


def test_missing_prepared_data_and_checkpoints_exit_2_with_the_message(tmp_path):
  result = _run("run.py", "--config=configs/quickstart.py", f"--workdir={tmp_path / 'run'}",
                f"--config.data.prepared_dir={tmp_path / 'none'}", "--config.data.root=")
  assert result.returncode == cli_errors.USER_ERROR_EXIT, result.stderr[-2000:]
  assert "is not prepared and data.root is empty" in result.stderr
  assert "Traceback" not in result.stderr
  result = _run("-m", "multiformer_jax.evaluate", "--workdir", str(tmp_path / "none"))
  assert result.returncode == cli_errors.USER_ERROR_EXIT, result.stderr[-2000:]
  assert "config.json not found" in result.stderr and "Traceback" not in result.stderr


def test_the_traceback_on_request(monkeypatch):
  def fail():
    raise InvalidValue("data.cmvn='x'; valid: utterance, global, none")
  with pytest.raises(SystemExit) as info:
    cli_errors.report_user_errors(fail)
  assert info.value.code == 2
  monkeypatch.setenv(cli_errors.TRACEBACK_ENV, "1")
  with pytest.raises(ValueError, match="data.cmvn='x'"):
    cli_errors.report_user_errors(fail)


def test_an_error_that_is_not_the_users_keeps_its_traceback():
  """Only a UserError is reported as the user's mistake; a library's own ValueError or OSError
  (a bug, an unforeseen failure) propagates with its traceback."""
  def bug():
    raise ValueError("operands could not be broadcast together")
  with pytest.raises(ValueError, match="broadcast"):
    cli_errors.report_user_errors(bug)
  with pytest.raises(FileNotFoundError):
    cli_errors.report_user_errors(lambda: open("/nonexistent/of/the/library", encoding="utf-8"))


def test_help_exits_0_and_says_each_commands_first_paragraph_whole():
  for command in (("run.py",), ("-m", "multiformer_jax.train")):   # multiformer-train's module
    done = _run(*command, "--help")
    assert done.returncode == 0 and "--workdir" in done.stdout + done.stderr, command
  for module, ending in (("multiformer_jax.ablate", "(markdown + CSV)."),
                         ("multiformer_jax.import_fairseq", "(`--config.st.init_from=OUT`).")):
    done = _run("-m", module, "--help")
    assert done.returncode == 0
    assert ending in " ".join(done.stdout.split()), done.stdout
