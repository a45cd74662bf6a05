"""Losses and scores: fairseq's label-smoothed cross-entropy, sacreBLEU, WER.

Losses are returned as sums plus a denominator (the number of target tokens, EOS included) so
that accumulation over micro-batches and devices is exact.
"""

from __future__ import annotations

import unicodedata

import jax
import jax.numpy as jnp

from data_prep.common.token_ids import EOS_ID, PAD_ID

CTC_BLANK_ID = 0    # fairseq's CTC blank: <s>, which no target contains


def label_smoothed_nll(logits, targets, epsilon: float, pad_id: int = PAD_ID):
  """fairseq label_smoothed_nll_loss, summed over non-pad tokens.

  eps_i = epsilon / (V - 1); loss = (1 - epsilon - eps_i) * nll + eps_i * sum_v(-log p_v).
  logits [B, U, V], targets [B, U] -> (loss_sum, nll_sum, ntokens).
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  mask = (targets != pad_id).astype(jnp.float32)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  smooth = -jnp.sum(log_probs, axis=-1)
  eps_i = epsilon / (logits.shape[-1] - 1)
  loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
  return jnp.sum(loss * mask), jnp.sum(nll * mask), jnp.sum(mask)


def ctc_loss_sum(logits, mask, targets, weights, blank_id: int = CTC_BLANK_ID,
                 pad_id: int = PAD_ID, eos_id: int = EOS_ID):
  """Summed CTC loss of the target tokens (EOS and pad left out) given per-frame logits.

  logits [B, T, V] and mask [B, T] (True = valid frame) of the encoder output; targets [B, U]
  (tokens + EOS, pad after); weights [B] (0 = padding example). The blank is fairseq's CTC
  blank, <s> (id 0), which no target contains. An utterance whose frames cannot emit its labels
  (fewer frames than labels plus repeats) adds nothing, as fairseq's zero_infinity.
  -> (loss sum, number of utterances counted).
  """
  import optax  # pylint: disable=import-outside-toplevel
  labels = jnp.where((targets == pad_id) | (targets == eos_id), pad_id, targets)
  label_paddings = (labels == pad_id).astype(jnp.float32)
  per_utterance = optax.ctc_loss(logits.astype(jnp.float32), 1.0 - mask.astype(jnp.float32),
                                 labels, label_paddings, blank_id=blank_id)       # [B]
  frames = jnp.sum(mask, axis=1)
  label_count = jnp.sum(1.0 - label_paddings, axis=1)
  repeats = jnp.sum((labels[:, 1:] == labels[:, :-1]) & (label_paddings[:, 1:] == 0), axis=1)
  feasible = (frames >= label_count + repeats) & (weights > 0)
  return (jnp.sum(jnp.where(feasible, per_utterance, 0.0)),
          jnp.sum(feasible.astype(jnp.float32)))


def corpus_bleu(hypotheses: list[str], references: list[str]) -> dict:
  """sacreBLEU (13a, case-sensitive) on detokenised text: score and signature, and chrF
  (sacreBLEU's chrF2, character 6-grams), which loose references such as subtitles punish
  less for a right word in another form."""
  import sacrebleu  # pylint: disable=import-outside-toplevel
  metric = sacrebleu.metrics.BLEU()
  result = metric.corpus_score(hypotheses, [references])
  chrf = sacrebleu.metrics.CHRF()
  return {"bleu": round(result.score, 2), "signature": str(metric.get_signature()),
          "detail": str(result),
          "chrf": round(chrf.corpus_score(hypotheses, [references]).score, 2),
          "chrf_signature": str(chrf.get_signature())}


def _is_punctuation(token: str) -> bool:
  return all(unicodedata.category(c).startswith("P") for c in token)


def normalize_for_wer(text: str) -> list[str]:
  """fairseq's WER normalisation: 13a tokenisation, drop tokens made only of Unicode
  punctuation, lowercase."""
  from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a  # pylint: disable=import-outside-toplevel
  tokens = Tokenizer13a()(text).split()
  return [t.lower() for t in tokens if not _is_punctuation(t)]


def corpus_wer(hypotheses: list[str], references: list[str]) -> dict:
  """fairseq's corpus WER (`scoring/wer.py` with --wer-tokenizer 13a --wer-remove-punct
  --wer-lowercase): total word edit distance over total reference words, x100. A reference that
  is empty after normalisation adds no words but its hypothesis's words count as insertions."""
  import jiwer  # pylint: disable=import-outside-toplevel
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
  refs = [" ".join(normalize_for_wer(r)) for r in references]
  hyps = [" ".join(normalize_for_wer(h)) for h in hypotheses]
  words = sum(len(r.split()) for r in refs)
  if not words:
    raise ValueError("every reference is empty after WER normalisation")
  # jiwer takes neither an empty reference nor an empty hypothesis: those cost one edit a word.
  edits = sum(len(h.split()) + len(r.split()) for h, r in zip(hyps, refs) if not (h and r))
  scored = [i for i, (h, r) in enumerate(zip(hyps, refs)) if h and r]
  if scored:
    out = jiwer.process_words([refs[i] for i in scored], [hyps[i] for i in scored])
    edits += out.substitutions + out.deletions + out.insertions
  return {"wer": round(100.0 * edits / words, 2), "edits": int(edits), "words": int(words),
          "normalisation": "13a tokens, punctuation-only tokens dropped, lowercased (fairseq "
                           "--wer-tokenizer 13a --wer-remove-punct --wer-lowercase)"}
