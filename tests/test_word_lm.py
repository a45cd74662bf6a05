"""The word n-gram LM (interpolated Kneser-Ney, Chen & Goodman 1998) and n-best rescoring."""

import itertools
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from multiformer_jax import schema
from multiformer_jax.data import input_pipeline as ip
from multiformer_jax.evaluation import results, word_lm
from multiformer_jax.evaluation.inference import decode_split
from multiformer_jax.experiment import pipeline_config

BOS, EOS = word_lm.BOS, word_lm.EOS


def reference_prob(sentences, order, discounts, base, word, history):
  """Chen & Goodman's interpolated Kneser-Ney, transcribed with counts found by scanning the
  padded sentences for every query (no tables shared with the implementation)."""
  padded = [(BOS, *s, EOS) for s in sentences]

  def occurrences(gram):
    return [(s, i) for s in padded for i in range(len(s) - len(gram) + 1)
            if s[i:i + len(gram)] == gram]

  def adjusted(gram):              # raw count at the top order and after <s>, else N1+(. gram)
    found = occurrences(gram)
    if len(gram) == order or gram[0] == BOS:
      return len(found)
    return len({s[i - 1] for s, i in found})

  words = sorted({w for s in padded for w in s[1:]})

  def p(w, h):
    k = len(h) + 1
    total = sum(adjusted((*h, v)) for v in words)
    if not h:
      types = sum(adjusted((v,)) > 0 for v in words)
      return (max(adjusted((w,)) - discounts[0], 0) / total
              + discounts[0] * types / total * (0.0 if w == EOS else base(w)))
    if not total:
      return p(w, h[1:])
    types = sum(adjusted((*h, v)) > 0 for v in words)
    d = discounts[k - 1]
    return max(adjusted((*h, w)) - d, 0) / total + d * types / total * p(w, h[1:])
  return p(word, tuple(history)[-(order - 1):] if order > 1 else ())


CORPUS = [s.split() for s in ("the cat sat on the mat", "the dog sat", "a cat saw the dog",
                              "the mat sat on a cat", "dog")]


def test_a_two_sentence_bigram_by_hand():
  # <s> a b </s>, <s> a c </s>; D = 0.5. Unigram continuation counts: a 1, b 1, c 1, </s> 2
  # (total 5, 4 types); base uniform over {a, b, c} and one unknown word: 1/4.
  lm = word_lm.WordLM([["a", "b"], ["a", "c"]], order=2, discounts=(0.5, 0.5))
  assert lm.prob("b", []) == pytest.approx(0.5 / 5 + 0.5 * 4 / 5 * 0.25)          # 0.2
  assert lm.prob(EOS, []) == pytest.approx(1.5 / 5)                                 # 0.3
  assert lm.prob("zebra", []) == pytest.approx(0.5 * 4 / 5 * 0.25)                  # 0.1
  assert lm.prob("a", [BOS]) == pytest.approx(1.5 / 2 + 0.5 * 1 / 2 * 0.2)          # 0.8
  assert lm.prob("b", ["a"]) == pytest.approx(0.5 / 2 + 0.5 * 2 / 2 * 0.2)          # 0.35
  assert lm.prob(EOS, ["b"]) == pytest.approx(0.5 + 0.5 * 0.3)                      # 0.65
  assert lm.log_prob(["a", "b"]) == pytest.approx(math.log(0.8 * 0.35 * 0.65))


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_probabilities_are_chen_and_goodmans(order):
  base = lambda w: {"the": 0.3, "zebra": 0.1}.get(w, 0.02)
  discounts = (0.4, 0.6, 0.7, 0.8)[:order]
  lm = word_lm.WordLM(CORPUS, order, base, discounts)
  histories = [[BOS], [BOS, "the"], ["the"], ["sat", "on"], ["on", "the"], ["zebra"],
               ["the", "zebra"], ["cat", "sat", "on"], []]
  for word in ["the", "cat", "mat", "sat", "zebra", EOS]:
    for history in histories:
      assert lm.prob(word, history) == pytest.approx(
          reference_prob(CORPUS, order, discounts, base, word, history), rel=1e-12), \
          (word, history)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_each_context_is_a_distribution(order):
  lm = word_lm.WordLM(CORPUS, order)          # Ney's discounts; uniform base with one unknown
  vocabulary = sorted({w for s in CORPUS for w in s}) + ["<an unknown word>", EOS]
  for history in itertools.chain([[BOS], [], ["the", "dog"], ["zebra", "sat"]],
                                 [[BOS, w] for w in ("the", "dog", "a")]):
    assert sum(lm.prob(w, history) for w in vocabulary) == pytest.approx(1.0, abs=1e-12)


def test_ney_discount_and_bad_settings():
  assert word_lm.discount_from_counts([1, 1, 2, 3]) == pytest.approx(2 / (2 + 2))
  with pytest.raises(ValueError, match="lm_order=0"):
    word_lm.WordLM(CORPUS, 0)
  with pytest.raises(ValueError, match="discounts"):
    word_lm.WordLM(CORPUS, 2, discounts=(0.5, 1.0))
  with pytest.raises(ValueError, match="at least one training sentence"):
    word_lm.WordLM([], 2)
  with pytest.raises(ValueError, match="lm_unigram='zipf'.*wordfreq"):
    word_lm.build_lm(["a b"], 2, "zipf", "en")


def test_the_unigram_level_backs_off_to_word_frequencies():
  base = word_lm.wordfreq_base("en")
  assert base("minutes") > 1e-5 > base("menets") == 1e-9
  lm = word_lm.build_lm(["It took five minutes.", "The cat sat."], 3, "wordfreq", "en")
  assert ("minutes",) in lm.counts and ("minutes", ".") not in lm.counts   # WER tokens
  # Neither word is in the training text: the real one is far likelier than the misspelling.
  assert lm.prob("daughters", ["three"]) > 1000 * lm.prob("dotts", ["three"])
  with pytest.raises(ValueError, match="no word list for 'xx'"):
    word_lm.wordfreq_base("xx")


class TableLM:
  def __init__(self, log_probs):
    self.log_probs = log_probs

  def log_prob(self, words):
    return self.log_probs[" ".join(words)]


def test_rescoring_adds_the_weighted_lm_log_probability_before_length_normalisation():
  texts = ["a b", "a c d", "unused"]
  scores = np.array([-1.0, -1.2, -np.inf])          # normalised scores; an empty slot
  lengths = np.array([3, 4, 5])                      # tokens with EOS
  lm = TableLM({"a b": -10.0, "a c d": -2.0})
  assert word_lm.rescore(texts, scores, lengths, lm, 0.0, 1.0) == 0
  # a b: -1.0 + 0.5 * -10 / 3 = -2.67; a c d: -1.2 + 0.5 * -2 / 4 = -1.45
  assert word_lm.rescore(texts, scores, lengths, lm, 0.5, 1.0) == 1
  # length penalty 0: sums, not means: -1.0 - 0.05 * 10 = -1.5 < -1.2 - 0.05 * 2 = -1.3
  assert word_lm.rescore(texts, scores, lengths, lm, 0.05, 0.0) == 1
  assert word_lm.rescore(texts, scores, lengths, lm, 0.01, 0.0) == 0   # -1.1 > -1.22


def test_decode_split_keeps_the_hypothesis_pick_chooses(prepared):
  _, prepared_dir = prepared
  config = schema.base_config()
  config.data.prepared_dir, config.data.num_buckets = prepared_dir, 1
  data = ip.SplitData(pipeline_config(config, "asr", "test"), "dev")
  batcher = ip.Batcher(data, False)
  beam, steps = 3, 12
  candidates = [data.references[i] for i in range(beam)]
  encoded = [data.vocab.encode(text)[:steps] for text in candidates]
  nbest = np.full((beam, steps), 1, np.int32)                       # pad
  for k, ids in enumerate(encoded):
    nbest[k, :len(ids)] = ids

  def translate(params, features, lengths, tasks, prefix, key):
    batch = features.shape[0]
    scores = np.tile(np.array([-1.0, -2.0, -np.inf]), (batch, 1))
    return jnp.asarray(np.tile(nbest, (batch, 1, 1))), jnp.asarray(scores)

  seen = []

  def pick(texts, scores, lengths):
    seen.append((list(texts), list(scores), list(lengths)))
    return 1
  hypotheses = decode_split(None, batcher, translate, False, 0, pick)
  assert hypotheses == [data.vocab.decode(nbest[1])] * len(data)
  texts, scores, lengths = seen[0]
  assert texts == [data.vocab.decode(row) for row in nbest]
  assert scores[:2] == [-1.0, -2.0] and lengths == [len(ids) + 1 for ids in encoded]


def test_lm_settings_read_the_eval_config():
  config = schema.base_config()
  assert results.lm_settings(config, "asr") is None                   # weight 0: no LM
  config.eval.lm_weight = 0.3
  assert results.lm_settings(config, "asr") == {"weight": 0.3, "order": 3,
                                                 "unigram": "wordfreq"}
  assert results.lm_settings(config, "st") is None                    # not in lm_stages
  assert results.lm_settings(config, "asr", 0.0) is None              # the CLI's --lm_weight
  config.eval.lm_stages = ("asr", "mt")
  with pytest.raises(ValueError, match="lm_stages"):
    results.lm_settings(config, "asr")
  config.eval.lm_stages = ("asr",)
  with pytest.raises(ValueError, match="lm_weight=-1"):
    results.lm_settings(config, "asr", -1.0)
  config.eval.lm_weight = 0.0               # refused whatever the weight
  config.eval.lm_unigram = "zipf"
  with pytest.raises(ValueError, match="lm_unigram='zipf'; valid: .*wordfreq"):
    results.lm_settings(config, "asr")
  config.eval.lm_unigram, config.eval.lm_order = "uniform", 0
  with pytest.raises(ValueError, match="lm_order=0; valid: an integer >= 1"):
    results.lm_settings(config, "st")


def test_training_refuses_bad_lm_settings_before_it_starts(tmp_path):
  from multiformer_jax.training import train
  config = schema.base_config()
  config.eval.lm_order = 0
  with pytest.raises(ValueError, match="lm_order=0"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_the_size_benchmark_runs_small(tmp_path, capsys):
  from benchmarks import word_lm as benchmark
  out = tmp_path / "word_lm.jsonl"
  benchmark.main(["--sentences", "300", "--types", "50", "--score_sentences", "20",
                  "--out", str(out)])
  row = json.loads(capsys.readouterr().out)
  assert row["ngrams"] == sum(row["ngrams_by_order"]) and row["ngrams_by_order"][0] <= 51
  assert row["mean_log_prob_per_word"] < 0 and json.loads(out.read_text())["machine"]
