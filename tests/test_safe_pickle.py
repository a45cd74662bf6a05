"""Untrusted checkpoints do not run code: a fairseq `.pt` is read from an allowlist of what
fairseq checkpoints hold (no torch needed), a pickle that would run a command is refused and the
command never runs. Fixtures: tests/fixtures/make_fairseq_pt_fixtures.py (torch.save)."""

import os
import pickletools
import subprocess
import sys
import zipfile

import jax
import numpy as np
import pytest

from multiformer_jax.fairseq_checkpoints import run_writer
from multiformer_jax.fairseq_checkpoints import safe_pickle

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "/tmp/multiformer_jax_fixture_pickle_ran"       # what malicious.pt's pickle writes


@pytest.mark.parametrize("name", ["fairseq_s2t_tiny.pt", "fairseq_s2t_tiny_dictconfig.pt"])
def test_fairseq_checkpoints_import_as_their_state_dict(name):
  """fairseq 0.12's layout (cfg a dict, model args a Namespace, meters as numpy scalars) and
  0.10's (args a Namespace, cfg an omegaconf DictConfig): the same model and weights as the
  state dict of fairseq_s2t_tiny.npz, bit for bit."""
  config, params, updates = run_writer.load_checkpoint(os.path.join(FIXTURES, name))
  npz_config, npz_params, _ = run_writer.load_checkpoint(
      os.path.join(FIXTURES, "fairseq_s2t_tiny.npz"))
  assert config == npz_config and updates == 1234
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, npz_params)


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
  path = os.path.join(FIXTURES, "malicious.pt")
  with zipfile.ZipFile(path) as archive:                # it does name a command to run
    listing = _disassembly(archive.read("malicious/data.pkl"))
  assert "GLOBAL     'posix system'" in listing and "REDUCE" in listing
  if os.path.exists(MARKER):
    os.remove(MARKER)
  with pytest.raises(safe_pickle.UnsafeCheckpoint, match=r"names posix\.system, which fairseq "
                                                         r"checkpoints do not hold.*nothing in "
                                                         r"it was run.*--trust_pickle"):
    safe_pickle.load(path)
  # The command line: refused with exit status 2, nothing written, the command never run.
  out = tmp_path / "run"
  result = subprocess.run([sys.executable, "-m", "multiformer_jax.import_fairseq",
                           "--checkpoint", path, "--data", str(tmp_path), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2 and "names posix.system" in result.stderr, result.stderr
  assert not out.exists() and not os.path.exists(MARKER)


def test_a_file_that_is_not_a_torch_zip_is_refused(tmp_path):
  path = tmp_path / "old.pt"
  path.write_bytes(b"\x80\x02}q\x00.")                    # a bare pickle: torch < 1.6's format
  with pytest.raises(safe_pickle.UnsafeCheckpoint, match="not a zip-format PyTorch checkpoint"):
    safe_pickle.load(str(path))


def _disassembly(pickled: bytes) -> str:
  import io  # pylint: disable=import-outside-toplevel
  text = io.StringIO()
  pickletools.dis(pickled, out=text)
  return text.getvalue()
