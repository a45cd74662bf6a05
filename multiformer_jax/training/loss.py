"""The training losses: fairseq's label-smoothed cross-entropy, ESPnet's hybrid CTC/attention
loss and head selection's KL term, as sums plus a denominator (the number of target tokens,
EOS included) so that accumulation over micro-batches and devices is exact.

`make_loss_sums` is what the train and dev steps (steps.py) differentiate and sum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from multiformer_common.errors import InvalidValue
from multiformer_common.token_ids import CTC_BLANK_ID, EOS_ID, PAD_ID
from multiformer_jax.data.input_pipeline import batch_tasks
from multiformer_jax.model import S2TModel, head_selection


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


def selection_temperature(train_cfg, initial: float, step):
  """Gumbel-sigmoid temperature after `step` updates: max(min, initial * exp(-decay * step));
  decay 0 (the reference) keeps it constant."""
  decay = train_cfg.selection_temperature_decay
  if not decay:
    return jnp.asarray(initial, jnp.float32)
  return jnp.maximum(train_cfg.selection_temperature_min,
                     initial * jnp.exp(-decay * jnp.asarray(step, jnp.float32)))


def make_loss_sums(model: S2TModel, label_smoothing: float, train_cfg=None,
                   ctc_weight: float = 0.0):
  """-> loss_sums(params, batch, deterministic, key=None, step=None) -> (loss, aux sums).

  Head-selection models add the KL term of their Gumbel-sigmoid samples, weighted by each
  task's target tokens (train.kl_weight; 0 in the published recipes, then it is only logged).

  With ctc_weight > 0 (a model with a CTC head) the loss is ESPnet's hybrid CTC/attention one,
  (1 - w) * label-smoothed CE + w * CTC, both summed over the batch and divided, like the CE,
  by the target tokens of the update. The CTC spells the batch's `ctc_targets` where it has
  them (an ST stage's source transcripts), else its targets.
  """
  cfg = model.config
  if ctc_weight and not cfg.ctc_head:
    raise InvalidValue(f"ctc_weight {ctc_weight} needs a model with a CTC head (ctc_head=True)")
  selecting = bool(cfg.encoder_candidates or cfg.decoder_candidates)

  def loss_sums(params, batch, deterministic, key=None, step=None):
    rngs = {"dropout": key} if key is not None else {}
    tasks = batch_tasks(batch)
    temperature = None if step is None or train_cfg is None else selection_temperature(
        train_cfg, cfg.selection_temperature, step)
    logits, sown = model.apply({"params": params}, batch["features"], batch["lengths"],
                               batch["prev_tokens"], deterministic, tasks, temperature,
                               rngs=rngs, mutable=["selection", "ctc"])
    targets = jnp.where(batch["weights"][:, None] > 0, batch["targets"], PAD_ID)
    loss, nll, tokens = label_smoothed_nll(logits, targets, label_smoothing)
    aux = {"nll": nll, "tokens": tokens}
    if ctc_weight:
      ctc_logits, ctc_mask = sown["ctc"]["logits"][0]
      # ASR: the transcript the decoder writes; ST: the source transcript (ctc_targets).
      ctc_targets = batch.get("ctc_targets", targets)
      ctc, _ = ctc_loss_sum(ctc_logits, ctc_mask, ctc_targets, batch["weights"], cfg.bos_id,
                            cfg.pad_id, cfg.eos_id)
      loss = (1.0 - ctc_weight) * loss + ctc_weight * ctc
      aux["ctc"] = ctc
    if selecting and not deterministic:
      per_example = jnp.sum(targets != PAD_ID, axis=1).astype(jnp.float32)
      kl = 0.0
      for side, (stack, candidates, heads) in enumerate(
          (("encoder", cfg.encoder_candidates, cfg.encoder_heads),
           ("decoder", cfg.decoder_candidates, cfg.decoder_heads))):
        if candidates:
          task_ids = None if tasks is None else tasks[side]
          if task_ids is None:
            task_ids = jnp.zeros(batch["weights"].shape, jnp.int32)
          task_tokens = jnp.zeros(cfg.stack_num_tasks(stack)).at[jnp.clip(task_ids, 0)].add(
              per_example)
          samples = sown["selection"][stack]["head_selector"]["samples"][0]
          kl = kl + head_selection.selection_kl(samples, task_tokens, heads / candidates)
      aux["kl"] = kl
      loss = loss + (train_cfg.kl_weight if train_cfg is not None else 0.0) * kl
    return loss, aux

  return loss_sums


def make_mt_loss_sums(model, label_smoothing: float):
  """The MT stage's loss_sums (make_loss_sums' signature): label-smoothed CE of an MTModel
  (model/mt_model.py) on a text-pair batch (data/text_pairs.py: source, prev_tokens, targets,
  weights)."""

  def loss_sums(params, batch, deterministic, key=None, step=None):
    del step                                  # no schedule inside the loss
    rngs = {"dropout": key} if key is not None else {}
    logits = model.apply({"params": params}, batch["source"], batch["prev_tokens"],
                         deterministic, rngs=rngs)
    targets = jnp.where(batch["weights"][:, None] > 0, batch["targets"], PAD_ID)
    loss, nll, tokens = label_smoothed_nll(logits, targets, label_smoothing)
    return loss, {"nll": nll, "tokens": tokens}

  return loss_sums
