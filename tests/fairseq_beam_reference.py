"""A plain numpy transcription of fairseq 0.12.2's beam search, the reference for tests.

`SequenceGenerator._generate` with `search.BeamSearch.step` and `finalize_hypos`, statement for
statement where it matters (buffers `tokens` [bsz * beam, max_len + 2] and `scores`
[bsz * beam, max_len + 1], 2 x beam candidates, EOS finalised only from the first beam columns,
`cands_to_ignore`, finished sentences removed from the batch and the beams reordered, the final
sort by score), and `NGramRepeatBlock`'s python path (`no_repeat_ngram_size`). Ensembles,
attention, sampling, constraints and match_source_len are left out.

Two switches reproduce the toolkit's documented deviations, both off by default (= fairseq):
`never_select` masks extra token ids like pad (the toolkit masks BOS), and `max_len` may be a
list (one per sentence) instead of fairseq's one batch-wide int.
"""

from __future__ import annotations

import math

import numpy as np


def _topk(values, k):
  """torch.topk along the last axis, ties to the lower index: (values, indices)."""
  order = np.argsort(-values, axis=-1, kind="stable")[..., :k]
  return np.take_along_axis(values, order, axis=-1), order


def generate(lprobs_fn, bsz: int, beam_size: int, vocab_size: int, max_len, *, eos: int = 2,
             pad: int = 1, unk: int = 3, min_len: int = 1, len_penalty: float = 1.0,
             normalize_scores: bool = True, unk_penalty: float = 0.0, prefix_tokens=None,
             never_select=(), no_repeat_ngram_size: int = 0):
  """lprobs_fn(tokens [n, step + 1], sentence ids [n]) -> log-probabilities [n, vocab] for the
  n rows still being decoded (row r is beam r % beam of sentence ids[r]).

  Returns finalized: per sentence, a list of {'tokens', 'score', 'positional_scores'} best
  first, tokens ending with EOS (as fairseq returns them).
  """
  max_lens = np.full(bsz, max_len) if np.ndim(max_len) == 0 else np.asarray(max_len)
  scores = np.zeros((bsz * beam_size, max_lens.max() + 1), np.float32)
  tokens = np.full((bsz * beam_size, max_lens.max() + 2), pad, np.int64)
  tokens[:, 0] = eos
  cands_to_ignore = np.zeros((bsz, beam_size), bool)
  finalized = [[] for _ in range(bsz)]
  finished = [False] * bsz
  num_remaining_sent = bsz
  cand_size = 2 * beam_size
  bbsz_offsets = (np.arange(bsz) * beam_size)[:, None]
  cand_offsets = np.arange(cand_size)
  original_batch_idxs = np.arange(bsz)
  if prefix_tokens is not None:
    prefix_tokens = np.asarray(prefix_tokens).reshape(bsz, -1)

  for step in range(int(max_lens.max()) + 1):
    row_sent = np.repeat(original_batch_idxs, beam_size)
    row_max_len = max_lens[row_sent]
    lprobs = np.array(lprobs_fn(tokens[:, :step + 1], row_sent), np.float32)
    lprobs[np.isnan(lprobs)] = -math.inf
    lprobs[:, pad] = -math.inf                                      # never select pad
    for token in never_select:
      lprobs[:, token] = -math.inf
    lprobs[:, unk] -= unk_penalty
    at_max = step >= row_max_len                                    # max length constraint
    lprobs[at_max, :eos] = -math.inf
    lprobs[at_max, eos + 1:] = -math.inf
    forcing = np.zeros(len(lprobs), bool)
    if prefix_tokens is not None and step < prefix_tokens.shape[1]:
      forcing = step < row_max_len
      prefix_toks = np.repeat(prefix_tokens[:, step], beam_size)
      prefix_lprobs = lprobs[np.arange(len(lprobs)), prefix_toks]
      prefix_mask = (prefix_toks != pad) & forcing
      lprobs[prefix_mask] = -math.inf
      lprobs[prefix_mask, prefix_toks[prefix_mask]] = prefix_lprobs[prefix_mask]
    if step < min_len:                        # minimum length (not where a prefix is forced)
      lprobs[~forcing, eos] = -math.inf
    if no_repeat_ngram_size > 0:
      lprobs = _no_repeat_ngram(tokens, lprobs, bsz, beam_size, step, no_repeat_ngram_size)

    # search.BeamSearch.step
    lp = lprobs.reshape(bsz, beam_size, vocab_size)
    if step == 0:
      lp = lp[:, ::beam_size, :]              # all beams are equal: use the first
    else:
      lp = lp + scores.reshape(bsz, beam_size, -1)[:, :, step - 1][:, :, None]
    flat = lp.reshape(bsz, -1)
    cand_scores, flat_indices = _topk(flat, min(beam_size * 2, flat.shape[1] - 1))
    cand_beams = flat_indices // vocab_size
    cand_indices = flat_indices % vocab_size

    cand_bbsz_idx = cand_beams + bbsz_offsets
    eos_mask = (cand_indices == eos) & (cand_scores != -math.inf)
    eos_mask[:, :beam_size][cands_to_ignore] = False
    # only consider eos when it's among the top beam_size indices
    eos_bbsz_idx = cand_bbsz_idx[:, :beam_size][eos_mask[:, :beam_size]]
    finalized_sents = []
    if eos_bbsz_idx.size > 0:
      eos_scores = cand_scores[:, :beam_size][eos_mask[:, :beam_size]]
      finalized_sents = _finalize_hypos(
          step, eos_bbsz_idx, eos_scores.copy(), tokens, scores, finalized, finished,
          beam_size, max_lens[original_batch_idxs], normalize_scores, len_penalty, eos)
      num_remaining_sent -= len(finalized_sents)
    assert num_remaining_sent >= 0
    if num_remaining_sent == 0:
      break

    if finalized_sents:                       # remove finished sentences from the batch
      new_bsz = bsz - len(finalized_sents)
      batch_mask = np.ones(bsz, bool)
      batch_mask[finalized_sents] = False
      batch_idxs = np.flatnonzero(batch_mask)
      eos_mask = eos_mask[batch_idxs]
      cand_beams = cand_beams[batch_idxs]
      bbsz_offsets = (np.arange(new_bsz) * beam_size)[:, None]
      cand_bbsz_idx = cand_beams + bbsz_offsets
      cand_scores = cand_scores[batch_idxs]
      cand_indices = cand_indices[batch_idxs]
      if prefix_tokens is not None:
        prefix_tokens = prefix_tokens[batch_idxs]
      cands_to_ignore = cands_to_ignore[batch_idxs]
      scores = scores.reshape(bsz, -1)[batch_idxs].reshape(new_bsz * beam_size, -1)
      tokens = tokens.reshape(bsz, -1)[batch_idxs].reshape(new_bsz * beam_size, -1)
      original_batch_idxs = original_batch_idxs[batch_idxs]
      bsz = new_bsz
    assert (step < max_lens[original_batch_idxs]).all()

    eos_mask[:, :beam_size] = ~((~cands_to_ignore) & (~eos_mask[:, :beam_size]))
    active_mask = eos_mask.astype(np.int64) * cand_size + cand_offsets[:eos_mask.shape[1]]
    new_cands_to_ignore, active_hypos = _topk(-active_mask, beam_size)   # smallest first
    cands_to_ignore = (-new_cands_to_ignore >= cand_size)[:, :beam_size]
    assert (~cands_to_ignore).any(axis=1).all()
    active_bbsz_idx = np.take_along_axis(cand_bbsz_idx, active_hypos, axis=1).reshape(-1)
    active_scores = np.take_along_axis(cand_scores, active_hypos, axis=1)

    tokens[:, :step + 1] = tokens[active_bbsz_idx, :step + 1]
    tokens.reshape(bsz, beam_size, -1)[:, :, step + 1] = np.take_along_axis(
        cand_indices, active_hypos, axis=1)
    if step > 0:
      scores[:, :step] = scores[active_bbsz_idx, :step]
    scores.reshape(bsz, beam_size, -1)[:, :, step] = active_scores

  for sent, hypos in enumerate(finalized):  # best first (fairseq sorts by score, descending)
    order = np.argsort([-h["score"] for h in hypos], kind="stable")
    finalized[sent] = [hypos[i] for i in order]
  return finalized


def _no_repeat_ngram(tokens, lprobs, bsz, beam_size, step, n):
  """fairseq's NGramRepeatBlock._no_repeat_ngram: every n-gram of each row of the whole
  `tokens` buffer (the start EOS and the pads after the step included), keyed by its first
  n - 1 tokens; the row's last n - 1 tokens ban what followed them."""
  gen_ngrams = [{} for _ in range(bsz * beam_size)]
  for bbsz_idx in range(bsz * beam_size):
    gen_tokens = tokens[bbsz_idx].tolist()
    for ngram in zip(*[gen_tokens[i:] for i in range(n)]):
      key = ",".join(str(x) for x in ngram[:-1])
      gen_ngrams[bbsz_idx][key] = gen_ngrams[bbsz_idx].get(key, []) + [ngram[-1]]
  if step + 2 - n >= 0:
    banned_tokens = [gen_ngrams[bbsz_idx].get(
        ",".join(str(x) for x in tokens[bbsz_idx, step + 2 - n:step + 1].tolist()), [])
                     for bbsz_idx in range(bsz * beam_size)]
  else:
    banned_tokens = [[] for _ in range(bsz * beam_size)]
  for bbsz_idx in range(bsz * beam_size):
    lprobs[bbsz_idx][np.asarray(banned_tokens[bbsz_idx], np.int64)] = -math.inf
  return lprobs


def _finalize_hypos(step, bbsz_idx, eos_scores, tokens, scores, finalized, finished, beam_size,
                    max_lens, normalize_scores, len_penalty, eos):
  """fairseq's finalize_hypos: store the EOS hypotheses (at most beam_size per sentence, first
  come first kept) and return the batch positions of sentences that are now finished."""
  tokens_clone = tokens[bbsz_idx][:, 1:step + 2].copy()           # skip the leading EOS
  tokens_clone[:, step] = eos
  pos_scores = scores[bbsz_idx][:, :step + 1].copy()
  pos_scores[:, step] = eos_scores
  pos_scores[:, 1:] = pos_scores[:, 1:] - pos_scores[:, :-1]
  if normalize_scores:
    eos_scores = eos_scores / (step + 1) ** len_penalty
  cum_unfin = []
  prev = 0
  for f in finished:
    if f:
      prev += 1
    else:
      cum_unfin.append(prev)
  unfin_idx = bbsz_idx // beam_size
  sent = unfin_idx + np.asarray(cum_unfin)[unfin_idx]
  seen = sorted(set(zip(sent.tolist(), unfin_idx.tolist())))
  for i in range(len(bbsz_idx)):
    if len(finalized[sent[i]]) < beam_size:
      finalized[sent[i]].append({"tokens": tokens_clone[i], "score": float(eos_scores[i]),
                                 "positional_scores": pos_scores[i]})
  newly_finished = []
  for s, u in seen:
    if not finished[s] and (len(finalized[s]) == beam_size or step == max_lens[u]):
      finished[s] = True
      newly_finished.append(u)
  return newly_finished
