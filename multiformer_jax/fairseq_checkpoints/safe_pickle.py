"""Reading a fairseq `.pt` checkpoint without running code from it, and without PyTorch.

A `.pt` file (torch.save, PyTorch >= 1.6) is a zip: `*/data.pkl`, a pickle of the checkpoint's
objects whose tensors refer to `*/data/{key}` files of raw little-endian storage. A pickle can
name any callable to be run while loading it (`os.system`, say); this reader builds only what
fairseq checkpoints hold, from an allowlist (ALLOWED), as torch.load(weights_only=True) does:
containers and numbers, argparse.Namespace (fairseq < 0.10's args), numpy scalars and arrays
(fairseq's meters), tensors and parameters (as numpy arrays of their storage), and omegaconf's
and fairseq's config classes (fairseq 0.10's DictConfig), which become `Recorded` objects that
only keep what the pickle gives them, never running their code. Anything else is refused with
`UnsafeCheckpoint`, naming it. `load_unsafe` unpickles fully with torch, behind the import's
explicit --trust_pickle.

PyTorch itself is not needed: the storages are read with numpy.
"""

from __future__ import annotations

import argparse
import collections
import io
import pickle
import zipfile

import numpy as np

from multiformer_common.errors import InvalidValue

# Modules whose classes are kept as Recorded objects (built without their code).
RECORDED_MODULES = ("omegaconf", "fairseq", "typing")


class UnsafeCheckpoint(InvalidValue):
  """The checkpoint names something a fairseq checkpoint does not hold."""


class Recorded:
  """An object of a class this reader does not build (omegaconf's, fairseq's): what the pickle
  passes it (arguments, state) is kept, nothing of the class runs. Each such class is a
  subclass named after it (`recorded_class`)."""
  qualname = "?"

  def __new__(cls, *args, **kwargs):
    recorded = object.__new__(cls)
    recorded.args, recorded.kwargs, recorded.state = args, kwargs, None
    return recorded

  def __init__(self, *args, **kwargs):
    pass

  def __setstate__(self, state):
    self.state = state

  def __repr__(self):
    return f"Recorded({self.qualname})"


_RECORDED_CLASSES = {}


def recorded_class(qualname: str) -> type:
  """The Recorded subclass standing for `qualname` (one per name)."""
  if qualname not in _RECORDED_CLASSES:
    _RECORDED_CLASSES[qualname] = type(qualname.rsplit(".", 1)[-1], (Recorded,),
                                       {"qualname": qualname})
  return _RECORDED_CLASSES[qualname]


class _Storage:
  def __init__(self, dtype):
    self.dtype = dtype


def _storage_types() -> dict:
  import ml_dtypes  # pylint: disable=import-outside-toplevel  # jax's dependency
  types = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
           "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64,
           "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
           "ByteStorage": np.uint8, "BoolStorage": np.bool_}
  return {f"torch.{name}": _Storage(np.dtype(dtype)) for name, dtype in types.items()}


def _rebuild_tensor(storage, offset, size, stride, *unused):
  """torch._utils._rebuild_tensor_v2 over a numpy storage: a strided view, copied."""
  itemsize = storage.dtype.itemsize
  if not size:
    return storage[offset].copy()
  return np.lib.stride_tricks.as_strided(
      storage[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride)).copy()


def _rebuild_parameter(data, *unused):
  return data


def _latin1(text, encoding="latin1"):
  """_codecs.encode as protocol-2 pickles use it for bytes (a numpy scalar's): latin1 only."""
  if encoding != "latin1":
    raise UnsafeCheckpoint(f"bytes encoded as {encoding!r}, not latin1")
  return text.encode("latin1")


def _numpy_scalar(dtype, data=None):
  return np.frombuffer(data, dtype)[0] if data is not None else dtype.type()


ALLOWED = {
    "collections.OrderedDict": collections.OrderedDict,
    "collections.defaultdict": collections.defaultdict,
    "builtins.set": set, "builtins.frozenset": frozenset, "builtins.slice": slice,
    "builtins.complex": complex, "builtins.dict": dict, "builtins.list": list,
    "builtins.tuple": tuple, "builtins.int": int, "builtins.float": float,
    "builtins.str": str, "builtins.bool": bool, "builtins.bytes": bytes,
    "argparse.Namespace": argparse.Namespace,
    "_codecs.encode": _latin1,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "numpy.core.multiarray.scalar": _numpy_scalar,
    "numpy._core.multiarray.scalar": _numpy_scalar,
    "numpy.dtype": np.dtype,
    "numpy.core.multiarray._reconstruct": np.ndarray.__new__,
    "numpy._core.multiarray._reconstruct": np.ndarray.__new__,
    "numpy.ndarray": np.ndarray,
}


class _Unpickler(pickle.Unpickler):
  def __init__(self, file, archive: zipfile.ZipFile, prefix: str, path: str):
    super().__init__(file)
    self.archive, self.prefix, self.path = archive, prefix, path
    self.allowed = {**ALLOWED, **_storage_types()}
    self.storages = {}

  def find_class(self, module, name):
    module = {"__builtin__": "builtins"}.get(module, module)     # protocol-2 (Python 2) names
    qualname = f"{module}.{name}"
    if qualname in self.allowed:
      return self.allowed[qualname]
    if module.split(".")[0] in RECORDED_MODULES:
      return recorded_class(qualname)
    raise UnsafeCheckpoint(
        f"{self.path} names {qualname}, which fairseq checkpoints do not hold (their tensors, "
        f"containers, numbers, argparse/omegaconf configs): it is refused and nothing in it "
        f"was run. If you trust where the file comes from, --trust_pickle loads it with "
        f"PyTorch's full unpickler, which runs whatever code the file names")

  def persistent_load(self, pid):
    kind, storage_type, key, _, numel = pid
    if kind != "storage" or not isinstance(storage_type, _Storage):
      raise UnsafeCheckpoint(f"{self.path}: a storage of an unknown type ({pid[:2]})")
    if key not in self.storages:
      raw = self.archive.read(f"{self.prefix}/data/{key}")
      self.storages[key] = np.frombuffer(raw, storage_type.dtype, int(numel))
    return self.storages[key]


def load(path: str):
  """The objects of a `.pt` checkpoint, built from the allowlist only."""
  try:
    archive = zipfile.ZipFile(path)
  except zipfile.BadZipFile as error:
    raise UnsafeCheckpoint(f"{path} is not a zip-format PyTorch checkpoint (torch.save of "
                           f"PyTorch >= 1.6); older formats need --trust_pickle") from error
  with archive:
    names = [n for n in archive.namelist() if n.endswith("/data.pkl")]
    if len(names) != 1:
      raise UnsafeCheckpoint(f"{path}: no single data.pkl in the archive ({names})")
    prefix = names[0][:-len("/data.pkl")]
    byteorder = f"{prefix}/byteorder"
    if byteorder in archive.namelist() and archive.read(byteorder) != b"little":
      raise UnsafeCheckpoint(f"{path}: big-endian storages are not read")
    return _Unpickler(io.BytesIO(archive.read(names[0])), archive, prefix, path).load()


def load_unsafe(path: str):
  """torch.load with full unpickling: runs any code the file names (--trust_pickle)."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    raise ImportError("--trust_pickle reads the checkpoint with PyTorch: pip install torch") \
        from error
  checkpoint = torch.load(path, map_location="cpu", weights_only=False)
  return {**checkpoint, "model": {k: v.float().numpy() for k, v in checkpoint["model"].items()}}


def plain(value):
  """Recorded omegaconf / fairseq config objects -> plain dicts, lists and values."""
  if isinstance(value, Recorded):
    state = value.state if isinstance(value.state, dict) else {}
    content = state.get("_content", state.get("_val"))
    if value.qualname.endswith("DictConfig"):
      return {k: plain(v) for k, v in (content or {}).items()}
    if value.qualname.endswith("ListConfig"):
      return [plain(v) for v in content or []]
    if "_val" in state:
      return plain(state["_val"])
    return value.args[0] if len(value.args) == 1 else value
  if isinstance(value, dict):
    return {k: plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(plain(v) for v in value)
  return value
