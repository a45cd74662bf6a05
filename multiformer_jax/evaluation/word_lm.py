"""A word n-gram language model (interpolated Kneser-Ney) and n-best rescoring with it.

The model follows Chen & Goodman (1998), "An Empirical Study of Smoothing Techniques for
Language Modeling", interpolated Kneser-Ney, as SRILM and KenLM build it:

    P_k(w | h) = max(a(h w) - D_k, 0) / a(h .) + D_k * N(h .) / a(h .) * P_{k-1}(w | h')

with h' the history h without its first word, a(h .) = sum_w a(h w), N(h .) the number of
words w with a(h w) > 0, and a history never seen (a(h .) = 0) backing off to P_{k-1} whole.
a(g) is the count of n-gram g at the highest order and for n-grams that start with <s> (no word
can precede them), and its continuation count (the number of distinct words seen before g)
otherwise. The unigram level interpolates with a `base` distribution over words instead of the
uniform one: the discounted mass goes to words the training text never had, in proportion to
how common they are in the language. D_k = n1 / (n1 + 2 n2) from the counts of counts at
order k (Ney, Essen & Kneser 1994), unless given.

Words are the WER's tokens (`metrics.normalize_for_wer`: 13a tokens, punctuation dropped,
lowercased), so the model scores exactly what WER counts.

Rescoring (ESPnet's and fairseq's shallow-fusion score, on a finished n-best list): a
hypothesis of L tokens (EOS included) that the search scored S / L ** lenpen scores
(S + weight * log P_LM(words)) / L ** lenpen after rescoring.
"""

from __future__ import annotations

import collections
import functools
import math
import sys
from typing import Callable, Iterable, Sequence

import numpy as np

from multiformer_common.errors import InvalidValue
from multiformer_jax.evaluation.metrics import normalize_for_wer

BOS, EOS = "<s>", "</s>"
UNIGRAM_BASES = ("wordfreq", "uniform")


def wordfreq_base(lang: str) -> Callable[[str], float]:
  """-> base(word): the word's frequency in `lang` by the wordfreq package (Speer, 2022: counts
  from Wikipedia, subtitles, news, books, web text; its "large" list where it has one). A word
  it does not list gets its floor, 1e-9 (so the base sums to slightly more than 1 over an open
  vocabulary)."""
  try:
    import wordfreq  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("eval.lm_unigram='wordfreq' needs the wordfreq package (pip install "
                      "-r requirements.txt); eval.lm_unigram='uniform' needs nothing") from e
  if lang not in wordfreq.available_languages():
    raise InvalidValue(f"eval.lm_unigram='wordfreq': wordfreq has no word list for {lang!r}; "
                     f"it has {sorted(wordfreq.available_languages())}. Use "
                     "eval.lm_unigram='uniform' for this language.")

  @functools.lru_cache(maxsize=None)
  def base(word: str) -> float:
    return max(wordfreq.word_frequency(word, lang), 1e-9)
  return base


def check_settings(order: int, unigram: str | None = None):
  """Refuses an order that is not an integer >= 1, or a unigram back-off (when given) that is
  not one of UNIGRAM_BASES, naming the config key and the valid values."""
  if not isinstance(order, int) or order < 1:
    raise InvalidValue(f"eval.lm_order={order!r}; valid: an integer >= 1")
  if unigram is not None and unigram not in UNIGRAM_BASES:
    raise InvalidValue(f"eval.lm_unigram={unigram!r}; valid: {UNIGRAM_BASES}")


def discount_from_counts(counts: Iterable[float]) -> float:
  """Ney's D = n1 / (n1 + 2 n2) from the n-grams seen once (n1) and twice (n2), in (0, 1)."""
  counts = list(counts)
  n1 = sum(1 for c in counts if c == 1)
  n2 = sum(1 for c in counts if c == 2)
  if n1 == 0:
    return 0.5
  return min(max(n1 / (n1 + 2 * n2), 0.05), 0.95)


class WordLM:
  """An interpolated Kneser-Ney word n-gram model of `sentences` (lists of words).

  base: the unigram level's back-off distribution, base(word) -> probability (None: uniform
  over the training words and one unknown word). discounts: D_1..D_n (None: Ney's estimate).
  """

  def __init__(self, sentences: Iterable[Sequence[str]], order: int = 3,
               base: Callable[[str], float] | None = None,
               discounts: Sequence[float] | None = None):
    check_settings(order)
    self.order = order
    raw = collections.Counter()                       # every n-gram of orders 1..n
    sentence_count = 0
    for words in sentences:
      sentence_count += 1
      tokens = (BOS, *map(sys.intern, words), EOS)    # one string object per word type
      for k in range(1, order + 1):
        for start in range(len(tokens) - k + 1):
          if k > 1 or start > 0:                      # <s> alone is never predicted
            raw[tokens[start:start + k]] += 1
    if not sentence_count:
      raise InvalidValue("a word LM needs at least one training sentence; got none")
    # a(g): raw counts at the top order and for <s>-initial n-grams; below the top order the
    # continuation count, the number of distinct n-grams (x, *g) one word longer.
    continuation = collections.Counter(gram[1:] for gram in raw if len(gram) > 1)
    self.counts = {gram: (count if len(gram) == order or gram[0] == BOS else
                          continuation[gram]) for gram, count in raw.items()}
    del raw, continuation
    self.context_total = collections.Counter()        # a(h .)
    self.context_types = collections.Counter()        # N(h .)
    by_order = collections.defaultdict(list)
    for gram, count in self.counts.items():
      self.context_total[gram[:-1]] += count
      self.context_types[gram[:-1]] += 1
      by_order[len(gram)].append(count)
    if discounts is None:
      discounts = [discount_from_counts(by_order[k]) for k in range(1, order + 1)]
    if len(discounts) != order or not all(0 < d < 1 for d in discounts):
      raise InvalidValue(f"word LM discounts {list(discounts)}: valid: {order} values in (0, 1)")
    self.discounts = tuple(float(d) for d in discounts)
    self.vocabulary = {g[0] for g in self.counts if len(g) == 1}
    if base is None:
      uniform = 1.0 / (len(self.vocabulary - {EOS}) + 1)
      base = lambda word: uniform
    self.base = base

  def prob(self, word: str, history: Sequence[str]) -> float:
    """P(word | history), the history cut to the model's last order - 1 words."""
    history = tuple(history)[-(self.order - 1):] if self.order > 1 else ()
    p = self.discounts[0] * self.context_types[()] / self.context_total[()] * (
        0.0 if word == EOS else self.base(word))
    p += max(self.counts.get((word,), 0) - self.discounts[0], 0) / self.context_total[()]
    for k in range(1, len(history) + 1):
      h = history[-k:]
      total = self.context_total.get(h, 0)
      if not total:
        continue
      d = self.discounts[k]
      p = (max(self.counts.get((*h, word), 0) - d, 0) / total
           + d * self.context_types[h] / total * p)
    return p

  def log_prob(self, words: Sequence[str]) -> float:
    """Natural-log probability of a sentence, its end included."""
    tokens = [BOS, *words, EOS]
    return sum(math.log(self.prob(tokens[i], tokens[max(0, i - self.order + 1):i]))
               for i in range(1, len(tokens)))


def build_lm(texts: Iterable[str], order: int, unigram: str, lang: str) -> WordLM:
  """A WordLM of detokenised `texts` in WER tokens, its unigram level backed off to `unigram`
  (one of UNIGRAM_BASES) in language `lang`."""
  check_settings(order, unigram)
  base = wordfreq_base(lang) if unigram == "wordfreq" else None
  return WordLM((normalize_for_wer(t) for t in texts), order, base)


def rescore(hypotheses: Sequence[str], scores: np.ndarray, lengths: np.ndarray,
            lm: WordLM, weight: float, length_penalty: float) -> int:
  """Index of the best of one utterance's n-best after adding weight * log P_LM to each
  hypothesis's summed score (module docstring). scores: the search's normalised scores (-inf
  for empty slots); lengths: tokens per hypothesis, EOS included."""
  best, best_score = 0, -math.inf
  for i, (text, score, length) in enumerate(zip(hypotheses, scores, lengths)):
    if not np.isfinite(score):
      continue
    rescored = score + weight * lm.log_prob(normalize_for_wer(text)) / length ** length_penalty
    if rescored > best_score:
      best, best_score = i, rescored
  return best
