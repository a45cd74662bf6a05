"""The analyses: exact contribution decomposition for every head kind, diagonality metrics and
Algorithm 1 on known matrices, head blocks of W_o, and the three commands on a trained run."""

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import analyze
from multiformer_jax.analysis import locality
from multiformer_jax.training import train
from multiformer_jax.analysis import contributions as contrib
from multiformer_jax.analysis import diagonality as diag
from multiformer_jax.analysis import heads as heads_lib
from tests.test_model import tiny_model
from tests.test_train import tiny_config

RNG = np.random.default_rng(0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EVERY_KIND = ("1x(4*full) 1x(1*local(5)+1*kernel(16)+2*conv(5,2)) "
              "1x(2*local(3,2)+2*conv(3,1,separable))")
MORE_CONV = "1x(4*conv(5,2,standard)) 1x(2*conv(7,3)+2*local(65)) 1x(4*kernel(32))"


def _block_outputs(model, params, features, lengths):
  """Per layer: (reconstruction Σ_j F_i(x_j) + b_i, the real block output, mask, C)."""
  def fn(m, features, lengths):
    x, mask = m.encoder.embed(features, lengths)
    out = []
    for layer in m.encoder.layers:
      ln_x = layer.self_attn_layer_norm(x)
      mixing, values, bias = contrib.attention_taps(layer.self_attn, ln_x, mask)
      # Σ_j F_i(x_j) + b_i, which must equal the block's output x + attn(LN x).
      reconstructed = jnp.einsum("btij,btjd->bid", mixing, values) + x + bias
      out.append((reconstructed,
                  x + layer.self_attn(ln_x, mask), mixing, values, x))
      x = layer(x, mask)
    return mask, out
  return jax.jit(lambda p, f, l: nn.apply(fn, model)({"params": p}, f, l))(
      params, features, lengths)


@pytest.mark.parametrize("layout", [EVERY_KIND, MORE_CONV])
def test_decomposition_reconstructs_the_attention_block_exactly(layout):
  model, params = tiny_model(encoder_layout=layout, qkv_bias=True)
  # Non-zero biases everywhere, so the value and conv biases are part of what is checked.
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: p + 0.1 * jnp.asarray(RNG.normal(size=p.shape), p.dtype)
      if path[-1].key == "bias" else p, params)
  features = jnp.asarray(RNG.normal(size=(2, 72, 12)), jnp.float32)
  lengths = jnp.array([72, 45])
  mask, layers = _block_outputs(model, params, features, lengths)
  for reconstructed, real, *_ in layers:
    scale = float(jnp.max(jnp.abs(real)))
    error = float(jnp.max(jnp.abs(reconstructed - real) * mask[..., None]))
    assert error < 1e-4 * max(scale, 1.0), error


@pytest.mark.parametrize("residual", [True, False])
def test_contribution_matrix_is_the_norm_of_each_transformed_vector(residual):
  batch, taps, n, d = 2, 3, 7, 5
  mixing = RNG.normal(size=(batch, taps, n, n)).astype(np.float32)
  values = RNG.normal(size=(batch, taps, n, d)).astype(np.float32)
  x = RNG.normal(size=(batch, n, d)).astype(np.float32)
  mask = np.arange(n)[None, :] < np.array([[7], [4]])
  c = np.asarray(contrib.contribution_matrix(jnp.asarray(mixing), jnp.asarray(values),
                                             jnp.asarray(x), jnp.asarray(mask), residual))
  for b in range(batch):
    for i in range(n):
      for j in range(n):
        f = sum(mixing[b, t, i, j] * values[b, t, j] for t in range(taps))
        f = f + (x[b, i] if i == j and residual else 0)
        expected = np.linalg.norm(f) if mask[b, i] and mask[b, j] else 0.0
        np.testing.assert_allclose(c[b, i, j], expected, rtol=1e-5, atol=1e-5)


def test_local_and_conv_taps_stay_inside_their_receptive_field():
  model, params = tiny_model(encoder_layout=MORE_CONV, qkv_bias=True)
  features = jnp.asarray(RNG.normal(size=(1, 120, 12)), jnp.float32)
  _, layers = _block_outputs(model, params, features, jnp.array([120]))
  mixing = np.asarray(layers[1][2][0])       # layer 2: 2 conv(7,3) heads x 7 taps, 2 local
  n = mixing.shape[-1]
  distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
  # Local(65) heads: nothing beyond 32 tokens.
  assert np.all(mixing[-2:][:, distance > 32] == 0)
  assert np.all(mixing[-2:][:, distance <= 32].sum() > 0)
  # Conv(7,3) tap tau of compressed key m reads frame 3m + tau - 3: each tap column j is only
  # reachable at offsets j = 3m + tau - 3, i.e. (j - tau + 3) % 3 == 0.
  for tau in range(7):
    columns = np.flatnonzero(np.abs(mixing[tau]).sum(axis=0) > 0)
    assert columns.size and np.all((columns - tau + 3) % 3 == 0), tau


def test_diagonality_of_identity_and_uniform_matrices():
  n = 10
  identity = np.eye(n)
  np.testing.assert_allclose(diag.diagonality_curve(identity), np.ones(2 * n))
  assert diag.curve_area(diag.diagonality_curve(identity)) == pytest.approx(1.0)
  uniform = np.ones((n, n))
  curve = diag.diagonality_curve(uniform)
  for w in range(1, 2 * n + 1):
    inside = sum(1 for i in range(n) for j in range(n) if abs(i - j) <= w // 2)
    assert curve[w - 1] == pytest.approx(inside / n / n)
    assert diag.diagonality(uniform, w) == pytest.approx(inside / n / n)
    assert diag.contribution_loss(uniform, w) == pytest.approx(1 - inside / n / n)
  assert diag.curve_area(curve) == pytest.approx(curve.mean())
  # The paper's CCD: the area under D(w) over the discrete w = 1 .. 2N.
  area = sum(sum(1 for i in range(n) for j in range(n) if abs(i - j) <= w // 2) / n / n
             for w in range(1, 2 * n + 1))
  assert diag.curve_area_unnormalised(curve) == pytest.approx(area)
  assert diag.curve_area_unnormalised(diag.diagonality_curve(identity)) == pytest.approx(2 * n)
  assert curve[-1] == pytest.approx(1.0)
  # Unnormalised rows give the same result: rows are normalised first.
  np.testing.assert_allclose(diag.diagonality_curve(3.0 * identity + 0.0), np.ones(2 * n))


@pytest.mark.parametrize("n,radius", [(30, 0), (30, 2), (60, 5), (100, 12), (200, 20)])
def test_algorithm_1_recovers_the_bandwidth_of_banded_matrices(n, radius):
  distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
  banded = np.where(distance <= radius, 1.0, 0.0)
  noisy = banded + 1e-4 * RNG.uniform(size=(n, n))      # below t after normalisation
  assert diag.select_window(banded) == 2 * radius + 1
  assert diag.select_window(noisy) == 2 * radius + 1
  # A far diagonal above t within the patience (N/10 diagonals) extends the window to it ...
  gap = max(1, n // 10 - 1)
  extended = noisy + np.where(distance == radius + gap, 0.5, 0.0)
  assert diag.select_window(extended) == 2 * (radius + gap) + 1
  # ... one beyond the patience does not.
  far = noisy + np.where(distance == radius + n // 10 + 2, 0.5, 0.0)
  assert diag.select_window(far) == 2 * radius + 1


def test_window_from_samples_reproduces_table_1_of_the_paper():
  # (mu, sigma, w) of En-De layers 1-12 (Alastruey et al. 2022, Table 1).
  table = [(3.41, 13.15, 17), (1.18, 3.45, 5), (0.51, 1.56, 3), (2.25, 1.30, 5),
           (4.03, 0.28, 5), (7.03, 1.03, 9), (11.37, 1.13, 13), (7.94, 1.16, 11),
           (12.56, 1.85, 15), (16.47, 2.40, 19), (13.28, 1.90, 17), (16.28, 3.86, 21)]
  for mu, sigma, window in table:
    mean, std, w = diag.window_from_samples([mu - sigma, mu + sigma])
    assert (mean, std) == pytest.approx((mu, sigma))
    assert w == window and w % 2 == 1


def test_wo_head_blocks_map_to_the_heads_of_a_mixed_layout():
  model, params = tiny_model(encoder_layout=EVERY_KIND)
  layer = 1                                       # local(5), kernel(16), conv(5,2) x 2
  labels = heads_lib.head_labels(model.config.layout[layer])
  assert labels == ["local(5)", "kernel(16)", "conv(5,2)", "conv(5,2)"]
  attn = params["encoder"][f"layers_{layer}"]["self_attn"]
  w_o = np.asarray(attn["out_proj"]["kernel"])
  blocks = heads_lib.head_weight_blocks(params, layer, 4)
  head_dim = 32 // 4
  for h in range(4):
    np.testing.assert_array_equal(blocks["W_o"][h], w_o[h * head_dim:(h + 1) * head_dim])
    np.testing.assert_array_equal(blocks["W_v"][h], np.asarray(attn["v_proj"]["kernel"])
                                  [:, h * head_dim:(h + 1) * head_dim])
  # Zeroing the W_o rows of head 2 (the kernel head) silences exactly that head.
  z = jnp.asarray(RNG.normal(size=(1, 9, 4, head_dim)), jnp.float32)
  silenced = w_o.copy()
  silenced[head_dim:2 * head_dim] = 0
  norms = np.asarray(contrib.head_output_norms(z, jnp.asarray(silenced)))[0]
  assert np.all(norms[:, 1] == 0) and np.all(norms[:, [0, 2, 3]] > 0)
  shares = heads_lib.utterance_head_shares(norms)
  assert shares[1] == 0 and shares.sum() == pytest.approx(1.0, abs=0.2)
  expected = np.abs(np.einsum("nc,cd->nd", np.asarray(z[0, :, 0]), w_o[:head_dim])).sum(-1)
  np.testing.assert_allclose(norms[:, 0], expected, rtol=1e-5)
  # Data-free shares: one row per layer, summing to one.
  weight_shares = heads_lib.weight_norm_shares(
      heads_lib.layer_weight_blocks(params, model.config.layout))
  assert weight_shares["W_o"].shape == (3, 4)
  np.testing.assert_allclose(weight_shares["W_o"].sum(1), 1.0, rtol=1e-6)


def test_efficient_layout_merges_equal_layers():
  table = [{"attention": a, "heads": 4, "window": w} for a, w in
           [("full", 17), ("full", 5), ("local(5)", 5), ("local(5)", 5), ("local(9)", 9)]]
  assert locality.efficient_layout(table) == "2x(4*full) 2x(4*local(5)) 1x(4*local(9))"


@pytest.fixture(scope="module")
def trained_run(prepared, tmp_path_factory):
  """A tiny two-stage run (a few updates per stage) whose checkpoints the commands read."""
  _, prepared_dir = prepared
  config = tiny_config(prepared_dir, max_updates=4, eval_every=4)
  workdir = str(tmp_path_factory.mktemp("analysed_run"))
  train.train_and_evaluate(config, workdir)
  return workdir


def saved_name(workdir):
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    return json.load(f)["name"]


def _nonempty(path):
  """PNGs of real figures are kilobytes; tables have a header and rows."""
  assert os.path.exists(path), path
  assert os.path.getsize(path) > (5000 if path.endswith(".png") else 50), path


def test_the_three_commands_write_plots_tables_and_a_runnable_config(trained_run, tmp_path,
                                                                    monkeypatch):
  out = str(tmp_path / "analysis")
  common = ["--workdir", trained_run, "--num_utterances", "5", "--batch_size", "2",
            "--checkpoint", "latest", "--out", out, "--no_progress"]
  analyze.main(["heads", "--stage", "st"] + common)
  for name in ("head_weights_W_o_st.png", "head_weights_W_v_st.png",
               "head_output_share_st.png", "heads_st.csv", "heads_st.md"):
    _nonempty(os.path.join(out, name))
  with open(os.path.join(out, "heads_st.csv"), encoding="utf-8") as f:
    lines = f.read().splitlines()
  assert len(lines) == 1 + 2 * 4                   # 2 layers x 4 heads
  assert "local(5)" in lines[1] and "kernel(8)" in lines[-1]

  # The paper's view by default: the main diagonal (most of each row) hidden.
  hidden = []
  draw = locality.plots.contribution_matrices
  monkeypatch.setattr(locality.plots, "contribution_matrices",
                      lambda *a, **k: hidden.append(a[3]) or draw(*a, **k))
  analyze.main(["contributions", "--stages", "asr", "st"] + common)
  assert hidden == [True, True]
  for name in ("contributions_asr.png", "contributions_st.png", "diagonality_asr.png",
               "diagonality_st.png", "ccd.png", "ccd.csv", "ccd.md"):
    _nonempty(os.path.join(out, name))
  with open(os.path.join(out, "ccd.csv"), encoding="utf-8") as f:
    rows = f.read().splitlines()[1:]
  assert len(rows) == 2 * 2 and all(0 < float(r.split(",")[2]) <= 1 for r in rows)

  # Runs compared (an ablation's layouts): one CCD plot, per-run files, the same run's CCDs.
  other = str(tmp_path / "other_run")
  shutil.copytree(trained_run, other)
  with open(os.path.join(other, "config.json"), encoding="utf-8") as f:
    saved = json.load(f)
  saved["name"] = "renamed"
  with open(os.path.join(other, "config.json"), "w", encoding="utf-8") as f:
    json.dump(saved, f)
  compared = str(tmp_path / "compared")
  analyze.main(["contributions", "--stages", "st", "--compare", other] +
               common[:-3] + ["--out", compared, "--no_progress"])
  name = saved_name(trained_run)
  for tag in (name, "renamed"):
    _nonempty(os.path.join(compared, f"contributions_st_{tag}.png"))
  with open(os.path.join(compared, "ccd.csv"), encoding="utf-8") as f:
    compared_rows = list(csv.DictReader(f))
  assert [r["run"] for r in compared_rows] == [name] * 2 + ["renamed"] * 2
  assert [r["ccd_mean"] for r in compared_rows[:2]] == [r["ccd_mean"] for r in compared_rows[2:]]

  config_path = str(tmp_path / "generated_windows.py")
  analyze.main(["windows", "--stage", "st", "--full_layers", "1", "--config_out",
                config_path] + common)
  for name in ("windows_st.png", "windows_st.csv", "windows_st.md",
               "contributions_windows_st.png"):
    _nonempty(os.path.join(out, name))
  spec = importlib.util.spec_from_file_location("generated_windows", config_path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  layers = config.model.encoder_layout.split()
  assert layers[0] == "1x(4*full)" and layers[1].startswith("1x(4*local(")

  # run.py trains the generated config as is (two updates per stage, overrides on the CLI).
  workdir = str(tmp_path / "efficient")
  result = subprocess.run(
      [sys.executable, "run.py", f"--config={config_path}:train.seed=3", f"--workdir={workdir}",
       "--config.asr.max_updates=2", "--config.st.max_updates=2", "--config.asr.eval_every=2",
       "--config.st.eval_every=2"], cwd=REPO, capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    saved = json.load(f)
  assert saved["model"]["encoder_layout"] == config.model.encoder_layout
  assert saved["train"]["seed"] == 3
  assert os.path.exists(os.path.join(workdir, "st", "DONE.json"))


def test_missing_stage_is_named(trained_run, tmp_path):
  os.rename(os.path.join(trained_run, "asr"), os.path.join(trained_run, "asr_moved"))
  try:
    with pytest.raises(FileNotFoundError, match=r"no asr checkpoints.*stages with checkpoints: "
                                                r"\['st'\]"):
      analyze.main(["contributions", "--stages", "asr", "--workdir", trained_run,
                    "--out", str(tmp_path)])
  finally:
    os.rename(os.path.join(trained_run, "asr_moved"), os.path.join(trained_run, "asr"))
