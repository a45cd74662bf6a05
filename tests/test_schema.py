"""An experiment's schema in one place (multiformer_jax.schema): every key declared once with
its default and meaning, every experiment in configs/ valid, a bad key or value refused when
the config is loaded with the key's name and what would be valid, and --print_config."""

import dataclasses
import glob
import importlib
import os
import subprocess
import sys

import ml_collections
import pytest

from multiformer_common import cli_errors, settings
from multiformer_common.settings import ConfigError
from data_prep.embedded import spec as embedded_spec
from multiformer_jax import schema
from multiformer_jax.data import input_pipeline
from multiformer_jax.model import model_config
from multiformer_jax.schema import sections
from multiformer_jax.training import train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every class that declares keys of a config section -> the section.
DECLARING = [(cls, name) for name, cls in sections.SECTIONS.items()] + [
    (sections.DataSettings, "data"), (input_pipeline.PipelineConfig, "data"),
    (model_config.ModelConfig, "model"), (embedded_spec.CorpusSpec, "data.embedded")]


def _leaves(tree, prefix=""):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def test_every_key_is_declared_once_with_its_default_and_meaning():
  declared = {}
  for cls, section in DECLARING:
    for name, field in settings.config_fields(cls).items():
      key = f"{section}.{name}"
      assert key not in declared, f"{key} declared by {declared[key]} and {cls.__name__}"
      declared[key] = cls.__name__
      assert field.metadata["help"].strip(), f"{key} ({cls.__name__}) has no meaning given"
  base = dict(_leaves(schema.base_config().to_dict()))
  assert set(base) - {"name"} == set(declared)
  written = embedded_spec.config_defaults()    # data.embedded writes its tuples a,b
  for cls, section in DECLARING:
    for name, default in settings.config_defaults(cls).items():
      expected = written[name] if cls is embedded_spec.CorpusSpec else default
      assert base[f"{section}.{name}"] == expected, f"{section}.{name}"
  # A section's own base (the ST and MT stages) changes defaults, never a key's meaning.
  assert set(settings.config_fields(sections.StageSettings)) < set(
      settings.config_fields(sections.MTSettings))


def _experiments():
  for path in sorted(glob.glob(os.path.join(REPO, "configs", "*.py"))):
    name = os.path.basename(path)[:-3]
    if name != "__init__":
      module = importlib.import_module(f"configs.{name}")
      for arg in (None, "runlocal", *getattr(module, "VARIANTS", {})):
        yield pytest.param(module, arg, id=f"{name}:{arg or ''}")


@pytest.mark.parametrize("module, arg", list(_experiments()))
def test_every_experiment_and_variant_passes_the_check(module, arg):
  config = module.get_config(arg)
  model = schema.check(config)
  assert model.layout                          # its head layout parses


def test_configs_holds_experiments_alone():
  for path in glob.glob(os.path.join(REPO, "configs", "*.py")):
    if not path.endswith("__init__.py"):
      module = importlib.import_module(f"configs.{os.path.basename(path)[:-3]}")
      assert callable(getattr(module, "get_config", None)), f"{path} is not an experiment"


@pytest.mark.parametrize("key, value, message", [
    ("train.lr", 1e-3, r"unknown config key\(s\) \['train.lr'\]; valid keys of train: \[.*"
                       r"'log_every'"),
    ("eval.beam", "5", r"eval.beam='5' has type str; expected int like 5"),
    ("train.parallel", "xmap", r"train.parallel='xmap'; valid: 'pmap' \| 'jit'"),
    ("asr.ctc_weight", 1.0, r"asr.ctc_weight=1.0; valid: >= 0.0 and < 1.0"),
    ("st.encoder_init", "middle", r"st.encoder_init='middle'; valid: 'latest' \| 'best' \| "
                                  r"'average' \| 'around_best'"),
    ("eval.no_repeat_ngram_stages", ("st", "mt"),
     r"eval.no_repeat_ngram_stages=\('st', 'mt'\); valid: 'asr' \| 'st' \(each of the list\)"),
    ("eval.no_repeat_ngram_size", 1, r"eval.no_repeat_ngram_size=1: valid values are 0 \(off\) "
                                     r"or an n-gram length >= 2"),
    ("data.cmvn", "mean", r"data.cmvn='mean'; valid"),
    ("data.corpus", "librispeech", r"data.corpus='librispeech'; valid: one of \['mustc'"),
    ("data.embedded.voice", "x", r"unknown config key\(s\) \['data.embedded.voice'\]"),
    ("model.encoder_layout", "6x(4*ful)", r"ful"),
    ("asr.eval_every", 0, r"asr.eval_every=0; valid: a number of updates >= 1, or -1"),
])
def test_a_bad_key_or_value_is_named_with_what_is_valid(key, value, message):
  values = schema.base_config().to_dict()      # as a saved config.json is read back: a
  *path, leaf = key.split(".")                  # ConfigDict would refuse a wrong type itself
  node = values
  for part in path:
    node = node[part]
  node[leaf] = value
  with pytest.raises(ValueError, match=message):
    schema.check(ml_collections.ConfigDict(values))


def test_what_holds_between_keys_is_checked(tmp_path):
  config = schema.base_config()
  config.asr.keep_last = 2
  config.eval.checkpoint, config.eval.average_last = "average", 3
  with pytest.raises(ConfigError, match=r"asr.keep_last=2 keeps fewer checkpoints than "
                                        r"eval.average_last=3 averages; set asr.keep_last >= 3"):
    schema.check(config)
  config.eval.checkpoint = "latest"          # the ST encoder init alone averages the last 5
  config.st.encoder_init, config.eval.average_last = "average", 5
  with pytest.raises(ConfigError,
                     match=r"asr.keep_last=2 .* eval.average_last \(st.encoder_init\)=5"):
    schema.check(config)
  # Refused by training before anything is written.
  with pytest.raises(ConfigError, match="asr.keep_last=2"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")
  config = schema.base_config()
  config.asr.lr_scheduler, config.asr.max_updates = "polynomial_decay", 100
  with pytest.raises(ConfigError, match=r"asr.warmup_updates=10000 must be below "
                                        r"asr.max_updates=100"):
    schema.check(config)
  config = schema.base_config()
  config.st.text_encoder = "mt"
  with pytest.raises(ConfigError, match=r"set st.ctc_weight > 0"):
    schema.check(config)
  config.st.ctc_weight, config.mt.pairs = 0.3, "en-de"
  with pytest.raises(ConfigError, match=r"mt.pairs='en-de'; valid:  \(it trains on the ST "):
    schema.check(config)
  config.mt.pairs, config.model.task_tag = "", "target_lang"
  with pytest.raises(ConfigError, match=r"needs a model without task-keyed stacks"):
    schema.check(config)
  config = schema.base_config()
  config.data.corpus, config.data.root = "mtedx,europarl_st", "/data/mtedx"
  with pytest.raises(ConfigError, match=r"2 corpora but data.root '/data/mtedx' 1 directories"):
    schema.check(config)


def test_overrides_of_a_tuple_take_its_elements_type():
  config = schema.apply_arg(schema.base_config(), "train.stages=asr,model.conv_kernels=3:3")
  assert config.train.stages == ("asr",) and config.model.conv_kernels == (3, 3)
  with pytest.raises(ConfigError, match="unknown config variant 'tiny'"):
    schema.apply_arg(schema.base_config(), "tiny")


def _run(*args):
  env = {k: v for k, v in os.environ.items() if k != cli_errors.TRACEBACK_ENV}
  return subprocess.run([sys.executable, "run.py", *args], cwd=REPO, capture_output=True,
                        text=True, timeout=300, check=False, env=env)


def test_print_config_shows_the_whole_resolved_experiment():
  result = _run("--config=configs/s2t_v2.py:runlocal,train.seed=2", "--config.eval.beam=3",
                "--print_config")
  assert result.returncode == 0, result.stderr[-2000:]
  shown = result.stdout
  for line in ("name: s2t_multiformer_s_v2", "  seed: 2", "  beam: 3", "  d_model: 64",
               "  encoder_layout: 6x(1*local(65)+3*conv(5,2)) 6x(2*local(65)+2*conv(5,2))",
               "  compilation_cache: ~/.cache/multiformer_jax/jax"):
    assert line in shown.splitlines(), line
  keys = sum(1 for line in shown.splitlines() if ":" in line and not line.endswith(":"))
  assert keys == len(list(_leaves(schema.base_config().to_dict())))
  bad = _run("--config=configs/s2t_v2.py", "--config.train.parallel=xmap", "--print_config")
  assert bad.returncode == cli_errors.USER_ERROR_EXIT
  assert "train.parallel='xmap'; valid: 'pmap' | 'jit'" in bad.stderr
  assert "Traceback" not in bad.stderr


def test_the_stage_sections_differ_from_the_base_stage_only_in_defaults():
  stage = {f.name: f for f in dataclasses.fields(sections.StageSettings)}
  for cls in (sections.STSettings, sections.MTSettings):
    for name, field in ((f.name, f) for f in dataclasses.fields(cls) if f.name in stage):
      assert field.metadata["help"] == stage[name].metadata["help"] or name in (
          "update_freq",), f"{cls.__name__}.{name} changes the key's meaning"
