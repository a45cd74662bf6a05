"""The evaluation path besides the search: forced decoding scores, WER and BLEU as fairseq and
sacreBLEU define them, checkpoint averaging."""

import dataclasses
import unicodedata

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax.runtime import checkpoints as ckpt_lib
from multiformer_jax.evaluation import decode
from multiformer_jax.evaluation.metrics import corpus_bleu, corpus_wer
from multiformer_jax.model import init_cache
from tests.test_model import jitted_apply, tiny_model

RNG = np.random.default_rng(3)


def test_forced_decoding_scores_equal_teacher_forced_log_probabilities():
  """The cached search, forced along the reference (prefix = the reference, EOS forced right
  after it), scores what teacher forcing gives the reference: sum of log p(token) + log p(EOS)."""
  model, params = tiny_model()
  cfg = model.config
  variables = {"params": params}
  lengths = jnp.array([40, 23, 31])
  feats = jnp.asarray(RNG.normal(size=(3, 40, cfg.input_dim)), jnp.float32)
  refs = jnp.asarray(RNG.integers(4, cfg.vocab_size, size=(3, 6)), jnp.int32)
  prev = jnp.concatenate([jnp.full((3, 1), cfg.eos_id), refs], axis=1)          # EOS + ref
  targets = jnp.concatenate([refs, jnp.full((3, 1), cfg.eos_id)], axis=1)       # ref + EOS
  logp = jax.nn.log_softmax(jitted_apply(model)(variables, feats, lengths, prev))
  teacher = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0].sum(axis=1)

  apply = jitted_apply(model)
  encoded, mask = apply(variables, feats, lengths, method=model.encode)
  cross = apply(variables, encoded, method=model.cross_kv)
  beam = 2
  steps = refs.shape[1] + 1
  tokens, score = decode.beam_search(
      lambda t, i, c: model.apply(variables, t, i, c, cross, mask, method=model.decode_step),
      init_cache(model, 3 * beam, steps), 3, beam, steps, jnp.full((3,), refs.shape[1]),
      cfg.vocab_size, prefix_tokens=refs, normalize_scores=False)
  np.testing.assert_array_equal(tokens[:, :refs.shape[1]], refs)
  np.testing.assert_allclose(score, teacher, atol=1e-4)


def test_a_search_made_again_for_an_equal_model_reuses_its_compiled_programs():
  """make_beam_search for a model of an equal config (training's dev scoring, then evaluation
  after training) is the same jitted search: a batch shape decoded once is not traced again."""
  from multiformer_jax.evaluation.inference import make_beam_search
  from multiformer_jax.model import S2TModel
  model, params = tiny_model()
  first = make_beam_search(model, 2, 1.0, 0.0, 4)
  again = make_beam_search(S2TModel(dataclasses.replace(model.config)), 2, 1.0, 0.0, 4)
  assert again is first and make_beam_search(model, 3, 1.0, 0.0, 4) is not first
  feats = jnp.asarray(RNG.normal(size=(2, 24, model.config.input_dim)), jnp.float32)
  lengths = jnp.array([24, 17])
  tokens = first(params, feats, lengths)
  np.testing.assert_array_equal(again(params, feats, lengths), tokens)
  assert first._cache_size() == 1       # pylint: disable=protected-access  (one program)


def fairseq_wer(hypotheses, references):
  """fairseq's WerScorer with EvaluationTokenizer('13a', lowercase=True,
  punctuation_removal=True): tokenise, drop space-separated tokens made only of Unicode
  punctuation, lowercase; sum of word edit distances over sum of reference lengths."""
  from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

  def tokenize(sent):
    tokenized = Tokenizer13a()(sent)
    tokenized = " ".join(t for t in tokenized.split(" ")
                         if not all(unicodedata.category(c)[0] == "P" for c in t))
    return tokenized.lower()

  def edit_distance(a, b):
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
      prev, row[0] = row[0], i
      for j, y in enumerate(b, 1):
        prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]

  distance = length = 0
  for ref, pred in zip(references, hypotheses):
    ref_items, pred_items = tokenize(ref).split(), tokenize(pred).split()
    distance += edit_distance(ref_items, pred_items)
    length += len(ref_items)
  return 100.0 * distance / length


def test_wer_is_fairseqs():
  references = ["Hello, world!", "a x c d", "two words", "It's  fine -- «really».", "...",
                "Straße im ÜBERBLICK"]
  hypotheses = ["hello world", "a b c", "", "it's fine really", "an insertion", "strasse im"]
  result = corpus_wer(hypotheses, references)
  assert result["wer"] == round(fairseq_wer(hypotheses, references), 2)
  # hello world: 0; a b c vs a x c d: 2; '' vs 2 words: 2; 13a keeps «really» one token
  # (not punctuation only): 1; an empty reference's hypothesis words are insertions: 2;
  # strasse im vs straße im überblick: 2 -> 9 edits over 2 + 4 + 2 + 3 + 0 + 3 words.
  assert (result["edits"], result["words"]) == (9, 14)
  words = "the cat sat on a mat and then it ran to see the dog".split()
  for _ in range(20):
    refs = [" ".join(RNG.choice(words, RNG.integers(1, 9))) + RNG.choice([".", "", " ?"])
            for _ in range(6)]
    hyps = [" ".join(RNG.choice(words, RNG.integers(0, 9))).capitalize() for _ in range(6)]
    assert corpus_wer(hyps, refs)["wer"] == round(fairseq_wer(hyps, refs), 2)


def test_wer_refuses_references_that_are_all_empty():
  with pytest.raises(ValueError, match="every reference is empty"):
    corpus_wer(["a"], ["!!"])


def test_bleu_is_sacrebleu_13a_case_sensitive_with_its_signature():
  import sacrebleu
  refs = ["Der Hund bellt laut.", "Es war kein Vergnügen.", "Ich sehe das Haus."]
  hyps = ["Der Hund bellt.", "es war kein Vergnügen.", "Ich sehe das Haus."]
  result = corpus_bleu(hyps, refs)
  assert result["signature"] == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|" \
                                f"version:{sacrebleu.__version__}"
  assert result["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
  assert corpus_bleu(refs, refs)["bleu"] == 100.0
  assert corpus_bleu([h.lower() for h in refs], refs)["bleu"] < 100.0     # case counts


def test_scores_by_speaker_are_each_speakers_corpus_scores():
  """results.json's by_tag: one corpus WER per speaker (and per any tag with several values);
  a tag with one value in the split is left out."""
  import types
  from multiformer_jax.evaluation.scoring import scores_by_tag
  references = ["she set the table", "he knows a thing", "it is late", "all right then"]
  hypotheses = ["she set the table", "he knows the thing", "", "all right then"]
  data = types.SimpleNamespace(references=references, tag_values={
      "speaker": np.array(["en-us_f2-steady", "en-us_mike2", "en-us_mike2", "en-us_f2-steady"]),
      "domain": np.array(["ding"] * 4)})
  grouped = scores_by_tag("asr", data, hypotheses, ("speaker", "domain"))
  assert grouped == {"speaker": {
      "en-us_f2-steady": {"wer": 0.0, "utterances": 2},
      "en-us_mike2": {"wer": round(100 * (1 + 3) / (4 + 3), 2), "utterances": 2}}}


def test_checkpoint_averaging_is_the_mean_of_the_parameter_trees(tmp_path):
  checkpoints = ckpt_lib.StageCheckpoints(str(tmp_path / "ckpt"), keep_last=5)
  trees = []
  for step in (10, 20, 30, 40):
    tree = {"params": {"dense": {"kernel": RNG.normal(size=(3, 4)).astype(np.float32),
                                 "bias": RNG.normal(size=(4,)).astype(np.float32)},
                       "scale": np.float32(RNG.normal())}}
    trees.append(tree["params"])
    checkpoints.save(step, tree, {"dev_loss": float(step)})
  params, which = checkpoints.select_params("average", 3)
  expected = jax.tree_util.tree_map(lambda *x: np.mean(np.stack(x), axis=0), *trees[1:])
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
                         params, expected)
  assert which == "average of steps [20, 30, 40]"


def test_averaging_takes_contiguous_checkpoints_only(tmp_path):
  """keep_last 2 keeps the best (step 10) beside the last two: averaging 3 must not reach
  back over the deleted steps 20 and 30 to it."""
  checkpoints = ckpt_lib.StageCheckpoints(str(tmp_path / "ckpt"), keep_last=2)
  for step in (10, 20, 30, 40, 50):
    checkpoints.save(step, {"params": {"w": np.full(2, step, np.float32)}},
                     {"dev_loss": 1.0 if step == 10 else float(step)})
  assert checkpoints.steps() == [10, 40, 50]
  params, which = checkpoints.select_params("average", 3)
  np.testing.assert_allclose(params["w"], [45.0, 45.0])
  assert which == ("average of steps [40, 50] (the 2 contiguous checkpoints kept of the 3 "
                   "asked for)")
  assert checkpoints.contiguous_steps(2) == [40, 50]


def test_around_best_averages_the_checkpoints_centred_on_the_best(tmp_path):
  """The thesis's "7 around the best" with 3: the best (step 40 of 10..80), one before, one
  after; keep_last 2 would delete them, keep_around_best keeps them."""
  checkpoints = ckpt_lib.StageCheckpoints(str(tmp_path / "ckpt"), keep_last=2,
                                          keep_around_best=3)
  losses = {10: 5.0, 20: 4.0, 30: 3.0, 40: 1.0, 50: 2.0, 60: 2.5, 70: 2.6, 80: 2.7}
  for step, loss in losses.items():
    checkpoints.save(step, {"params": {"w": np.full(2, step, np.float32)}}, {"dev_loss": loss})
  assert checkpoints.steps() == [30, 40, 50, 70, 80]
  assert checkpoints.steps_around_best(3) == [30, 40, 50]
  params, which = checkpoints.select_params("around_best", 3)
  np.testing.assert_allclose(params["w"], [40.0, 40.0])
  assert which == "average around the best (step 40) of steps [30, 40, 50]"
  # Steps 20 and 60 were deleted: around the best there is no 5-checkpoint run to take.
  assert checkpoints.steps_around_best(5) == [30, 40, 50]
  assert checkpoints.steps_around_best(1) == [40]


def test_around_best_takes_more_from_one_side_when_the_other_ends(tmp_path):
  checkpoints = ckpt_lib.StageCheckpoints(str(tmp_path / "ckpt"), keep_last=10)
  for step in (10, 20, 30, 40, 50):                 # the last is the best
    checkpoints.save(step, {"params": {"w": np.full(1, step, np.float32)}},
                     {"dev_loss": 100.0 - step})
  assert checkpoints.steps_around_best(3) == [30, 40, 50]
  assert checkpoints.steps_around_best(9) == [10, 20, 30, 40, 50]
  with pytest.raises(ValueError, match=r"checkpoint selection 'middle'; valid: latest, best, "
                                       r"average, around_best"):
    checkpoints.select_params("middle")
