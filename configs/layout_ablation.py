"""The papers' layout ablation at the main job's scale: the quickstart (corpus, model size,
stages, search) with only the encoder's head layout changed, one variant per layout.

    :full     6x(4*full)                    thesis architecture 1, the locality paper's baseline
    :local    6x(4*local(65))               thesis 3 (Local(64) = the centred window 65)
    :kernel   6x(4*kernel(110))             thesis 2, Performer FAVOR+ with int(hd ln hd) = 110
                                            features (head_dim 32), drawn once
    :conv     6x(4*conv(5,2))               thesis 4
    :mixed    the quickstart's layout       thesis v2 at half depth
    :NAME_thesis  (local, kernel, conv, mixed) the same layout computed as the thesis's code
                  computes it (model.semantics=thesis: docs/thesis_semantics.md)
The locality paper's efficient model has no variant here: its per-layer windows come from
Algorithm 1 on the `:full` run's contributions (`multiformer_jax.ablate`'s `windows(full)`
entry, or `python -m multiformer_jax.analyze windows`, which writes its config).

The updates per stage are fewer than the quickstart's so that six layouts x two seeds fit the
ablation's budget (docs/layout_ablation.md says what it took); the search is the quickstart's
with beam 5. The whole table, resumable:

    python -m multiformer_jax.ablate --workdir runs/layout_ablation --seeds 2 --jobs 2 \
        --configs configs/layout_ablation.py:full,configs/layout_ablation.py:local,\
configs/layout_ablation.py:kernel,configs/layout_ablation.py:conv,configs/layout_ablation.py:mixed,\
'windows(full)' --share_stages mt --splits tst-COMMON,tst-real,tst-unseen-synth
"""

from configs import quickstart
from multiformer_jax import schema

UPDATES = {"asr": 3500, "st": 1400}
LAYOUTS = {
    "full": "6x(4*full)",
    "local": "6x(4*local(65))",
    "kernel": "6x(4*kernel(110))",
    "conv": "6x(4*conv(5,2))",
    "mixed": "3x(1*local(65)+3*conv(5,2)) 3x(2*local(65)+2*conv(5,2))",
}
# What the papers report for the same layouts (MuST-C tst-COMMON, 12 encoder layers, d=256):
# the thesis's En-De BLEU / ASR WER (Sant 2022, tables 2-3), the locality paper's En-Es baseline.
REPORTED = {
    "full": (22.20, 13.47, "Sant 2022 En-De; Alastruey et al. 2022 En-Es full: BLEU 27.49"),
    "local": (22.00, 14.00, "Sant 2022 En-De"),
    "kernel": (20.28, 16.16, "Sant 2022 En-De"),
    "conv": (22.36, 13.58, "Sant 2022 En-De"),
    "mixed": (22.63, 13.74, "Sant 2022 En-De (v2, 12 layers)"),
}


def get_config(arg=None):
  config = quickstart.get_config()
  assert config.model.encoder_layout == LAYOUTS["mixed"], "the quickstart's layout moved"
  config.name = "layout_ablation"
  for stage, updates in UPDATES.items():
    config[stage].max_updates = updates
    config[stage].eval_every = updates      # one evaluation (and dev decode) at the end
  config.data.extra_test_splits = "tst-unseen-synth,tst-real"
  config.eval.beam = 5
  return schema.apply_arg(config, arg, VARIANTS)


# The layouts whose heads compute differently under model.semantics=thesis (full heads do not).
THESIS_DIFFERS = ("local", "kernel", "conv", "mixed")


def _layout(name, thesis=False):
  def variant(config):
    config.name = f"layout_ablation_{name}{'_thesis' if thesis else ''}"
    config.model.encoder_layout = LAYOUTS[name]
    if thesis:
      config.model.semantics = "thesis"
    config.reported.bleu, config.reported.wer, config.reported.source = REPORTED[name]
    return config
  variant.__doc__ = f"encoder layout {LAYOUTS[name]}" + (
      " as the thesis's code computes it" if thesis else "")
  return variant


VARIANTS = {name: _layout(name) for name in LAYOUTS}
VARIANTS.update({f"{name}_thesis": _layout(name, thesis=True) for name in THESIS_DIFFERS})
