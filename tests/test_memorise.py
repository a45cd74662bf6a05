"""End to end: a tiny model that memorised a handful of utterances decodes them back exactly.

The real path: prepared TFDS corpus -> batch assembly -> the compiled train step (Adam,
inverse-sqrt schedule, clipping) -> the jitted cached beam search of `inference.make_beam_search`
-> SentencePiece detokenisation, compared with the reference text character for character.
The tiny corpus's audio is tones and noise, so only the audio tells the utterances apart: a
control run whose encoder output is replaced by zeros must not decode them back.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import schema
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax import experiment
from multiformer_jax.training import optimizer
from multiformer_jax.training import steps
from multiformer_jax.evaluation.inference import make_beam_search
from multiformer_jax.model import S2TModel
from multiformer_jax.training.parallel import DataParallel

UTTERANCES = 5
UPDATES = 300
LAYOUTS = {"v2": "1x(1*local(9)+3*conv(5,2)) 1x(2*local(9)+2*conv(5,2))",
           "full": "2x(4*full)"}


class DeafModel(S2TModel):
  """The control: the decoder sees an encoder output of zeros."""

  def encode(self, features, lengths, deterministic=True, tasks=None, temperature=None):
    encoded, mask = super().encode(features, lengths, deterministic, tasks, temperature)
    return jnp.zeros_like(encoded), mask


def tiny_config(prepared_dir, layout):
  config = schema.base_config()
  m = config.model
  m.d_model, m.ffn_dim, m.conv_channels = 32, 64, 32
  m.encoder_layers, m.decoder_layers = 2, 1
  m.encoder_layout = layout
  m.dropout = m.attention_dropout = m.activation_dropout = 0.0
  m.max_target_positions = 64
  d = config.data
  d.prepared_dir, d.specaugment, d.num_buckets = prepared_dir, False, 1
  config.train.label_smoothing = 0.0
  return config


def memorise(config, task, model_class=S2TModel):
  """Trains on the first UTTERANCES dev utterances (one batch) -> (model, params, data, batch,
  final training loss per token)."""
  data = ip.SplitData(experiment.pipeline_config(config, task), "dev")
  batcher = ip.Batcher(data, train=False)
  batch = batcher.assemble(0, np.arange(UTTERANCES), 0)
  model = model_class(experiment.model_config_for(config, data.vocab.size))
  stage = config[task]
  stage.lr, stage.warmup_updates = 3e-3, 30
  tx, schedule = optimizer.make_optimizer(config.train, stage)
  dp = DataParallel("jit")
  train_step, _ = steps.make_steps(model, tx, schedule, dp, 0.0, config.train)
  state = dp.replicate(steps.create_state(model, tx, jax.random.PRNGKey(0)))
  device_batch = dp.shard(batch)
  for _ in range(UPDATES):
    state, sums = train_step(state, device_batch, True, True)
  loss = float(sums["loss"]) / float(sums["tokens"])
  return model, dp.unreplicate(state.params), data, batch, loss


def decode(model, params, data, batch, beam):
  """-> per utterance, the n-best list [(text, token count incl. EOS)], best first."""
  translate = make_beam_search(model, beam, 1.0, 0.0, 40, nbest=True)
  tokens, scores = translate(params, jnp.asarray(batch["features"]),
                             jnp.asarray(batch["lengths"]))
  return [[(data.vocab.decode(row), int((row != 1).sum()) + 1)
           for row, score in zip(rows, row_scores) if np.isfinite(score)]
          for rows, row_scores in zip(np.asarray(tokens), np.asarray(scores))]


def best(nbest_lists):
  return [hypotheses[0][0] for hypotheses in nbest_lists]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("task", ["asr", "st"])
def test_a_memorised_batch_decodes_back_exactly(prepared, layout, task):
  """Greedy decoding gives every utterance back. With beam 5, fairseq's stop rule ends an
  utterance once 5 hypotheses are finalised, even while a better one is still alive: a
  memorising model's other beams are nonsense that ends early, so an utterance longer than
  that can come back as one of them. Where the reference was finalised, it is the best."""
  config = tiny_config(prepared[1], LAYOUTS[layout])
  model, params, data, batch, loss = memorise(config, task)
  references = [data.references[i] for i in batch["index"]]
  assert len(set(references)) == UTTERANCES
  assert loss < 0.01, f"training loss per token {loss:.4f} after {UPDATES} updates"
  assert best(decode(model, params, data, batch, 1)) == references
  tokens = [len(data.vocab.encode(r)) + 1 for r in references]
  beam5 = decode(model, params, data, batch, 5)
  for hypotheses, reference, length in zip(beam5, references, tokens):
    texts = [text for text, _ in hypotheses]
    if reference in texts:
      assert texts[0] == reference
    else:                  # stopped before the reference could end: 5 shorter hypotheses
      assert len(hypotheses) == 5 and all(n < length for _, n in hypotheses), hypotheses
  assert sum(h[0][0] == r for h, r in zip(beam5, references)) >= 3


def test_without_the_audio_the_same_training_cannot_decode_them(prepared):
  config = tiny_config(prepared[1], LAYOUTS["v2"])
  model, params, data, batch, loss = memorise(config, "asr", DeafModel)
  references = [data.references[i] for i in batch["index"]]
  hypotheses = best(decode(model, params, data, batch, 5))
  assert len(set(hypotheses)) == 1                 # one sentence whatever the audio
  assert sum(h == r for h, r in zip(hypotheses, references)) <= 1
  assert loss > 0.1
