"""Scores: sacreBLEU and WER (fairseq's and ESPnet's normalisation). The training losses are
multiformer_jax/training/loss.py."""

from __future__ import annotations

import unicodedata

from multiformer_common.errors import InvalidValue


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
    raise InvalidValue(f"{len(hypotheses)} hypotheses for {len(references)} references")
  refs = [" ".join(normalize_for_wer(r)) for r in references]
  hyps = [" ".join(normalize_for_wer(h)) for h in hypotheses]
  words = sum(len(r.split()) for r in refs)
  if not words:
    raise InvalidValue("every reference is empty after WER normalisation")
  # jiwer takes neither an empty reference nor an empty hypothesis: those cost one edit a word.
  edits = sum(len(h.split()) + len(r.split()) for h, r in zip(hyps, refs) if not (h and r))
  scored = [i for i, (h, r) in enumerate(zip(hyps, refs)) if h and r]
  if scored:
    out = jiwer.process_words([refs[i] for i in scored], [hyps[i] for i in scored])
    edits += out.substitutions + out.deletions + out.insertions
  return {"wer": round(100.0 * edits / words, 2), "edits": int(edits), "words": int(words),
          "normalisation": "13a tokens, punctuation-only tokens dropped, lowercased (fairseq "
                           "--wer-tokenizer 13a --wer-remove-punct --wer-lowercase)"}
