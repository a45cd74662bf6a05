"""The head-layout language: every config round-trips, every bad case is rejected clearly."""

import glob
import importlib
import os

import pytest

from multiformer_jax import LayoutError, ModelConfig, format_layout, parse_layout
from multiformer_jax.experiment import UpdatePlan, update_plan
from multiformer_jax.model.layout import ConvHeads, FullHeads, HeadGroup, KernelHeads, LocalHeads

CONFIG_FILES = sorted(os.path.basename(f)[:-3] for f in glob.glob("configs/*.py")
                      if not f.endswith(("__init__.py", "common.py")))   # common: helpers


def test_parses_thesis_notation():
  layout = parse_layout("6x(1*local(65)+3*conv(5,2)) 6x(2*local(65)+2*conv(5,2))", 12, 4, 256)
  assert len(layout) == 12
  assert layout[0] == (HeadGroup(LocalHeads(65), 1), HeadGroup(ConvHeads(5, 2), 3))
  assert layout[11] == (HeadGroup(LocalHeads(65), 2), HeadGroup(ConvHeads(5, 2), 2))


def test_kinds_arguments_and_defaults():
  (layer,) = parse_layout("1x(full+2*local(7,3)+kernel+kernel(64)+conv+conv(7,3,separable)"
                          "+conv(3,1,standard))")
  kinds = [g.kind for g in layer]
  assert kinds == [FullHeads(), LocalHeads(7, 3), KernelHeads(256), KernelHeads(64),
                   ConvHeads(5, 2, "depthwise"), ConvHeads(7, 3, "separable"),
                   ConvHeads(3, 1, "standard")]
  assert [g.num_heads for g in layer] == [1, 2, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_every_config_round_trips(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  model_config = ModelConfig.from_dict(config.model)
  text = format_layout(model_config.layout)
  heads = config.model.encoder_candidates or config.model.encoder_heads   # head selection
  assert parse_layout(text, config.model.encoder_layers, heads) == model_config.layout
  assert format_layout(parse_layout(text)) == text


# Sant 2022, App. A Table 3 (ASR WER) and Table 2 (ST BLEU), MuST-C En-De tst-COMMON, transcribed.
THESIS_TABLES = {"s2t_transformer_s": (13.53, 22.7),  # BLEU: fairseq's published figure
                 "multiformer_full": (13.47, 22.2), "multiformer_fast": (16.16, 20.28),
                 "multiformer_local": (14.00, 22.0), "multiformer_conv_5_2": (13.58, 22.36),
                 "multiformer_conv_7_3": (13.86, 21.91), "multiformer_l_lc": (13.92, 21.55),
                 "multiformer_l_cl": (13.40, 22.36), "multiformer_h_lc": (13.45, 22.52),
                 "multiformer_s": (13.60, 22.42), "s2t_v2": (13.74, 22.63),
                 "multiformer_v3": (13.46, 22.41), "multiformer_v4": (13.50, 22.28),
                 "multiformer_v5": (13.54, 22.6)}


@pytest.mark.parametrize("name", sorted(THESIS_TABLES))
def test_thesis_configs_report_the_tables_numbers(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  assert (config.reported.wer, config.reported.bleu) == THESIS_TABLES[name]
  assert "Table 3" in config.reported.source


@pytest.mark.parametrize("text, kwargs, message", [
    ("12x(4*attn)", {}, "unknown head kind 'attn'; valid kinds: full, local"),
    ("12x(4*local(64))", {}, "local window must be an odd number >= 1"),
    ("12x(4*local)", {}, "local needs a window size"),
    ("12x(3*full)", dict(num_heads=4), "has 3 heads"),
    ("12x(2*full+1*conv(5,2))", dict(num_heads=4), "sum to 4"),
    ("6x(4*full) 5x(4*conv)", dict(num_layers=12), "describes 11 layers but the encoder has 12"),
    ("12x(4*conv(2,3))", {}, "conv stride 3 is larger than its kernel 2"),
    ("12x(4*conv(5,2,grouped))", {}, "unknown conv type 'grouped'; valid: depthwise"),
    ("12x(4*full)", dict(num_heads=3, d_model=256), "d_model 256 is not divisible by 3 heads"),
    ("12x(4*full", {}, "expected ')'"),
    ("12(4*full)", {}, "expected 'x' after the layer count 12"),
    ("12x(4*kernel(0))", {}, "kernel feature count must be >= 1"),
    ("12x(4*local(5,0))", {}, "local dilation must be >= 1"),
    ("", {}, "empty head layout"),
    ("12x(4*full(3))", {}, "full takes no arguments"),
])
def test_rejects_bad_layouts_with_a_clear_message(text, kwargs, message):
  with pytest.raises(LayoutError, match=None) as info:
    parse_layout(text, **kwargs)
  assert message in str(info.value)


def test_model_config_rejects_unknown_keys_and_types():
  from multiformer_jax.model.model_config import ConfigError
  with pytest.raises(ConfigError, match="unknown config key.*'model.d_modle'.*valid keys"):
    ModelConfig.from_dict({"d_modle": 256})
  with pytest.raises(ConfigError, match="model.d_model='256' has type str; expected int"):
    ModelConfig.from_dict({"d_model": "256"})
  with pytest.raises(LayoutError, match="has 2 heads"):
    ModelConfig.from_dict({"encoder_layout": "12x(2*full)"})
  with pytest.raises(ConfigError, match="kernel_redraw='always'"):
    ModelConfig.from_dict({"kernel_redraw": "always"})


# Frames per update (max_frames x update_freq) of the papers' recipes, transcribed: fairseq's
# MuST-C recipe 40000 x 8; the thesis 20000 x 16 (§5.2) and, without downsampling, 5000 x 64
# (App. B); the locality paper 40000 x 8 (App. C); head selection "320k tokens" (§4.2).
THESIS = (20000, 16)
PAPER_BATCHES = {
    "s2t_transformer_s": (40000, 8), "s2t_transformer_s_nodown": (5000, 64),
    "h_lc_nodown": (5000, 64), "multiformer_s_nodown": (5000, 64),
    "locality_en_de": (40000, 8), "locality_en_es": (40000, 8), "locality_en_it": (40000, 8),
    "head_selection_s2t_transformer_s": (40000, 8), "multilingual_s2t_transformer_s": (40000, 8),
    "adapters_s2t_transformer_s": (40000, 8),
    **{name: THESIS for name in THESIS_TABLES if name != "s2t_transformer_s"}}


@pytest.mark.parametrize("name", sorted(PAPER_BATCHES))
def test_paper_configs_train_with_the_papers_batch_per_update(name):
  module = importlib.import_module(f"configs.{name}")
  config = module.get_config()
  max_frames, update_freq = PAPER_BATCHES[name]
  assert config.data.max_frames == max_frames                 # per device
  for stage in ("asr", "st"):
    # The paper's GPU(s), one device here, eight: the same frames per update.
    assert update_plan(config, stage, devices=1) == UpdatePlan(max_frames, update_freq, 1)
    for devices in (2, 8):
      if update_freq % devices == 0:
        plan = update_plan(config, stage, devices=devices)
        assert plan.device_frames == max_frames and plan.frames_per_update == 320_000
  tiny = module.get_config("runlocal")             # the CPU variant: one batch per update
  assert tiny.asr.update_freq == tiny.st.update_freq == 1
  assert update_plan(tiny, "asr", devices=4).update_freq == 1


@pytest.mark.parametrize("pair", ["en-de", "en-es", "en-it"])
def test_each_locality_config_trains_on_its_own_pair(pair):
  config = importlib.import_module(f"configs.locality_{pair.replace('-', '_')}").get_config()
  assert config.data.pairs == pair and config.data.prepared_dir.endswith(pair.replace("-", "_"))
  assert config.model.encoder_layout.startswith("3x(4*full) 1x(4*local(5))")


def test_configs_fit_the_projects_width():
  for path in glob.glob("configs/*.py"):
    with open(path, encoding="utf-8") as f:
      long = [n for n, line in enumerate(f, 1) if len(line.rstrip("\n")) > 100]
    assert not long, f"{path}: lines {long} are over 100 characters"


def test_an_update_that_does_not_divide_into_micro_batches_is_refused():
  config = importlib.import_module("configs.s2t_transformer_s").get_config()
  with pytest.raises(ValueError, match=r"data.frames_per_update=320000 is not a whole number "
                                       r"of micro-batches of data.max_frames=40000 per device "
                                       r"x 3 device\(s\) = 120000 frames; per-device batches "
                                       r"that divide it on 3 device\(s\): none"):
    update_plan(config, "asr", devices=3)
  config.asr.update_freq = 4
  with pytest.raises(ValueError, match=r"asr.update_freq=4 and data.frames_per_update=320000 "
                                       r"both set the update"):
    update_plan(config, "asr", devices=1)


def test_every_config_is_a_paper_config_or_says_its_batch():
  """A config outside PAPER_BATCHES is one of ours (CPU-sized), with one batch per update."""
  for name in set(CONFIG_FILES) - set(PAPER_BATCHES) - {"default"}:
    config = importlib.import_module(f"configs.{name}").get_config()
    assert config.asr.update_freq == config.st.update_freq == 1, name
    assert not config.data.frames_per_update, name


# Gong et al. 2022, Tables 2-5, transcribed: (ASR WER, ST BLEU, Table 4 / 5 AVG-A, AVG-T, AVG-Z)
# per config and variant.
HEAD_SELECTION_TABLES = {
    ("multilingual_s2t_transformer_s", None): (49.0, 13.2, (13.2, 14.6, 8.5)),
    ("adapters_s2t_transformer_s", None): (41.1, 14.8, (None, 14.8, None)),
    ("head_selection_s2t_transformer_s", None): (40.0, 15.2, (15.2, 16.7, 10.4)),
    ("head_selection_s2t_transformer_s", "subset"): (44.7, 13.3, (13.3, 14.7, 8.5)),
    ("multilingual_s2t_transformer_s", "domain"): (42.7, 13.7, (13.7, 13.6, 13.9)),
    ("adapters_s2t_transformer_s", "domain"): (41.7, 14.0, (14.0, 14.3, 13.2)),
    ("head_selection_s2t_transformer_s", "domain"): (41.0, 15.6, (15.6, 15.9, 14.8)),
    ("head_selection_s2t_transformer_s", "domain,subset"): (41.8, 13.8, (13.8, 14.3, 13.1)),
    ("head_selection_s2t_transformer_s", "subset,domain"): (41.8, 13.8, (13.8, 14.3, 13.1))}


@pytest.mark.parametrize("name, variant", sorted(HEAD_SELECTION_TABLES, key=str))
def test_head_selection_configs_report_their_table_rows(name, variant):
  config = importlib.import_module(f"configs.{name}").get_config(variant)
  wer, bleu, averages = HEAD_SELECTION_TABLES[(name, variant)]
  assert (config.reported.wer, config.reported.bleu) == (wer, bleu)
  expected = " · ".join(f"{k} {'—' if v is None else v}"
                        for k, v in zip(("AVG-A", "AVG-T", "AVG-Z"), averages))
  assert config.reported.averages == expected
  assert "Table" in config.reported.source


def test_the_paper_multilingual_configs_key_and_split_their_data_as_the_paper():
  """Head selection keys encoder heads by source and decoder heads by target language; ASR
  trains on the 8 languages' ASR data, ST on the 10 training directions, 3 zero-shot
  directions are prepared for evaluation; the shared baseline has no task key, the adapters
  are per pair."""
  from configs import head_selection_s2t_transformer_s as hs
  config = hs.get_config()
  assert (config.model.encoder_task_tag, config.model.decoder_task_tag) == ("source_lang",
                                                                            "target_lang")
  assert config.asr.pairs.split(",") == ["ar-ar", "de-de", "el-el", "es-es", "fr-fr", "it-it",
                                         "pt-pt", "ru-ru"]
  assert len(hs.MTEDX_ST_PAIRS.split(",")) == 10 and config.st.pairs == ""
  assert config.data.eval_only_pairs == "it-en,it-es,pt-es"
  assert set(config.data.pairs.split(",")) == set(hs.MTEDX_ST_PAIRS.split(",") +
                                                  config.asr.pairs.split(","))
  baseline = importlib.import_module("configs.multilingual_s2t_transformer_s").get_config()
  assert not (baseline.model.task_tag or baseline.model.encoder_task_tag)
  adapters = importlib.import_module("configs.adapters_s2t_transformer_s").get_config()
  assert adapters.model.task_tag == "pair"
  domain = hs.get_config("domain")
  assert (domain.model.task_tag, domain.model.encoder_task_tag) == ("domain", "")


def _flat(config, prefix=""):
  """{'model.encoder_layout': value, ...} of a ConfigDict."""
  out = {}
  for key, value in config.items():
    if hasattr(value, "items"):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _changed(a, b):
  flat_a, flat_b = _flat(a), _flat(b)
  return {k for k in flat_a.keys() | flat_b.keys() if flat_a.get(k) != flat_b.get(k)}


# The layout ablation's variants and the thesis configs whose Table 2-3 figures they carry.
ABLATION_THESIS_CONFIGS = {"full": "multiformer_full", "local": "multiformer_local",
                           "kernel": "multiformer_fast", "conv": "multiformer_conv_5_2",
                           "mixed": "s2t_v2"}


@pytest.mark.parametrize("variant", sorted(ABLATION_THESIS_CONFIGS))
def test_layout_ablation_variants_change_only_the_encoder_layout(variant):
  from configs import layout_ablation, quickstart
  base = layout_ablation.get_config()
  config = layout_ablation.get_config(variant)
  assert _changed(base, config) <= {"name", "model.encoder_layout", "reported.bleu",
                                    "reported.wer", "reported.source"}
  # The ablation is the quickstart with fewer updates and beam 5: the same corpus and model.
  assert _changed(quickstart.get_config(), base) == {
      "name", "asr.max_updates", "st.max_updates", "asr.eval_every", "st.eval_every",
      "data.extra_test_splits", "eval.beam"}
  thesis = importlib.import_module(f"configs.{ABLATION_THESIS_CONFIGS[variant]}").get_config()
  assert (config.reported.bleu, config.reported.wer) == (thesis.reported.bleu,
                                                        thesis.reported.wer)
  assert config.model.encoder_layout.split("x(")[1] == thesis.model.encoder_layout.split(
      "x(")[1] or variant in ("kernel", "mixed")   # 6 layers of the thesis's 12; kernel: hd 32
