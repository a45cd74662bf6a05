"""The toolkit's default XLA flags (runtime/xla_flags.py): added, never overriding the user's."""

from multiformer_jax.runtime import xla_flags

LAYER_NORM = "--xla_gpu_enable_cudnn_layer_norm=true"


def test_gpu_flags_are_appended_to_the_users_flags():
  environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  got = xla_flags.add_default_xla_flags(environ, gpu=True)
  assert got == environ["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {LAYER_NORM}"
  assert xla_flags.add_default_xla_flags(environ, gpu=True) == got      # idempotent


def test_a_flag_the_user_names_is_left_as_set():
  environ = {"XLA_FLAGS": "--xla_gpu_enable_cudnn_layer_norm=false"}
  assert xla_flags.add_default_xla_flags(environ, gpu=True) == \
      "--xla_gpu_enable_cudnn_layer_norm=false"


def test_no_gpu_flags_without_the_cuda_plugin(monkeypatch):
  environ = {}
  assert xla_flags.add_default_xla_flags(environ, gpu=False) == ""
  assert "XLA_FLAGS" not in environ
  monkeypatch.setattr(xla_flags, "cuda_plugin_installed", lambda: False)
  assert xla_flags.add_default_xla_flags(environ) == ""
  monkeypatch.setattr(xla_flags, "cuda_plugin_installed", lambda: True)
  assert xla_flags.add_default_xla_flags(environ) == LAYER_NORM
