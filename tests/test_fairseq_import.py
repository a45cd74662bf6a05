"""fairseq S2T weights imported here give fairseq's own encoder outputs and decoder logits.

The fixture was produced by fairseq 0.12.2 itself (tests/fixtures/make_fairseq_fixture.py).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import build_model, init_params
from multiformer_jax.fairseq_checkpoints.checkpoint import (FairseqImportError, convert_state_dict,
                                            fairseq_model_args, model_config_from_fairseq)

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "fairseq_s2t_tiny.npz")


@pytest.fixture(scope="module")
def fixture():
  data = np.load(FIXTURE)
  state = {k[3:]: data[k] for k in data.files if k.startswith("sd/")}
  return data, state, json.loads(str(data["args"]))


def test_imported_weights_match_fairseq_outputs(fixture):
  data, state, args = fixture
  config = model_config_from_fairseq(args, state)
  model = build_model(config)
  params = convert_state_dict(state, config)
  # Same tree and shapes as a freshly initialised model of that config.
  fresh = init_params(model, jax.random.PRNGKey(0))
  assert jax.tree_util.tree_structure(fresh) == jax.tree_util.tree_structure(params)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_equal(a.shape, b.shape), fresh, params)

  features = jnp.asarray(data["features"])
  lengths = jnp.array([features.shape[1]])
  encoded, _ = model.apply({"params": params}, features, lengths, method=model.encode)
  np.testing.assert_allclose(encoded, data["encoder_out"], atol=1e-4, rtol=1e-4)
  logits = model.apply({"params": params}, features, lengths, jnp.asarray(data["prev_tokens"]))
  np.testing.assert_allclose(logits, data["logits"], atol=1e-4, rtol=1e-4)


def test_import_rejects_what_it_cannot_use(fixture):
  _, state, args = fixture
  with pytest.raises(FairseqImportError, match="architecture 'transformer_iwslt_de_en'"):
    model_config_from_fairseq({**args, "arch": "transformer_iwslt_de_en"}, state)
  config = model_config_from_fairseq(args, state)
  with pytest.raises(FairseqImportError, match="missing from the checkpoint"):
    convert_state_dict({k: v for k, v in state.items() if "fc1" not in k}, config)
  with pytest.raises(FairseqImportError, match="not understood by this model"):
    convert_state_dict({**state, "encoder.ctc_proj.weight": np.zeros((3, 3))}, config)


def test_model_args_from_every_checkpoint_layout():
  """fairseq < 0.10 pickles `args` as a Namespace (some tools rewrite it as a dict); >= 0.10
  `cfg` whose `model` is a DictConfig (here: any mapping) or a Namespace."""
  import argparse
  args = {"arch": "s2t_transformer_s", "encoder_layers": 12}
  layouts = [{"args": argparse.Namespace(**args)}, {"args": dict(args)},
             {"cfg": {"model": dict(args)}, "args": None},
             {"cfg": {"model": argparse.Namespace(**args)}}]
  for checkpoint in layouts:
    assert fairseq_model_args(checkpoint, "x.pt") == args
  with pytest.raises(FairseqImportError, match="x.pt has neither 'cfg' with a 'model' section "
                                               "nor 'args'"):
    fairseq_model_args({"cfg": {"task": {}}, "model": {}}, "x.pt")
