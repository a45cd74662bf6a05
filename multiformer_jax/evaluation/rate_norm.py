"""Speaking-rate normalisation at decoding time: a fast utterance is slowed down before the search.

A model trained on a few voices reads best at the pace it learned; one faster than that loses
words. Measured on the quickstart's model: a festival voice at rate 200 read WER 40.31, its
features stretched 1.25x in time 29.70 (the same voice at rate 156: 27.63). Chu & Povey
(ICASSP 2010, "Speaking rate adaptation using continuous frame rate normalization") estimate
each utterance's rate from a first decoding pass and recompute its features at a frame rate
scaled to a reference. Here:

1. a first pass of the encoder reads the CTC head's greedy path: its pieces (blanks and repeats
   collapsed) per encoder position are the utterance's *density*;
2. an utterance denser than `target` has its feature frames stretched by density / target (at
   most `max_stretch`) by linear interpolation along time (a finer frame shift, approximately:
   the 25 ms windows overlap by 15 ms), and the search reads the stretched frames.

An utterance at or below the target is decoded from its own frames (a factor of exactly 1
reproduces them bit for bit). Everything is static-shaped: the stretched batch has
ceil(frames * max_stretch) frames whatever the factors, so one program serves a batch shape.
The density is a property of the model as much as of the speech (a voice it reads unsurely
emits fewer pieces), so the target is chosen on dev for each model.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from multiformer_common.errors import InvalidValue



def check_settings(target: float, max_stretch: float) -> None:
  """Refuses a negative target or, when on, a largest stretch outside [1, 4]."""
  if not target >= 0:
    raise InvalidValue(f"eval.rate_norm_target={target}: give 0 (off) or a positive density of "
                     f"CTC pieces per encoder position (the quickstart uses 0.5)")
  if target > 0 and not 1.0 <= max_stretch <= 4.0:
    raise InvalidValue(f"eval.rate_norm_max_stretch={max_stretch}: valid values are in [1, 4] "
                     f"(1 = never stretch)")


def greedy_density(ctc_logits, mask, blank_id: int):
  """CTC greedy path -> collapsed non-blank pieces per valid position, [batch] float32.

  ctc_logits: [batch, positions, vocab]; mask: [batch, positions] bool (valid positions)."""
  best = jnp.argmax(ctc_logits, axis=-1)                              # [batch, positions]
  previous = jnp.concatenate([jnp.full_like(best[:, :1], -1), best[:, :-1]], axis=1)
  emitted = (best != blank_id) & (best != previous) & mask
  positions = jnp.maximum(jnp.sum(mask, axis=1), 1)
  return jnp.sum(emitted, axis=1) / positions


def stretch_factors(density, target: float, max_stretch: float):
  """density / target clipped to [1, max_stretch]: utterances at or below the target keep 1."""
  return jnp.clip(density / target, 1.0, max_stretch)


def stretched_frames(frames: int, max_stretch: float) -> int:
  """The static frame count of a stretched batch of `frames` padded frames."""
  return int(math.ceil(frames * max_stretch - 1e-9))


def stretch_features(features, lengths, factors, out_frames: int):
  """Each row's first lengths[b] frames resampled to round(lengths[b] * factors[b]) frames by
  linear interpolation, first and last frames kept (numpy's interp over a linspace), padded
  with zeros to `out_frames`. -> (features [batch, out_frames, dim], lengths [batch] int32).

  features: [batch, frames, dim]; lengths: [batch] int; factors: [batch] >= 1."""
  lengths = lengths.astype(jnp.int32)
  new_lengths = jnp.floor(lengths * factors + 0.5).astype(jnp.int32)
  new_lengths = jnp.clip(jnp.maximum(new_lengths, lengths), 1, out_frames)
  t = jnp.arange(out_frames, dtype=jnp.float32)[None, :]                  # [1, out_frames]
  # The integer product first, so that a factor of 1 lands on whole frames exactly.
  span = (lengths - 1).astype(jnp.float32)[:, None]
  steps = jnp.maximum(new_lengths - 1, 1).astype(jnp.float32)[:, None]
  source = jnp.minimum(t * span / steps, span)                            # [batch, out_frames]
  left = jnp.floor(source).astype(jnp.int32)
  right = jnp.minimum(left + 1, jnp.maximum(lengths[:, None] - 1, 0))
  weight = (source - left)[..., None]                                     # [batch, out, 1]
  take = lambda idx: jnp.take_along_axis(features, idx[..., None], axis=1)
  out = take(left) * (1.0 - weight) + take(right) * weight
  valid = t < new_lengths[:, None]
  return jnp.where(valid[..., None], out, 0.0).astype(features.dtype), new_lengths
