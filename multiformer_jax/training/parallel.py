"""All device-parallel plumbing in one place: `pmap` (the default) or `jit` with sharding.

Both give the same data-parallel semantics: the parameters are replicated, each device gets
an equal slice of the global batch, and step functions reduce sums over the whole global batch
with `DataParallel.psum` (a `lax.psum` under pmap; under jit the arrays are global, so the sum
is already complete). Across hosts (`jax.distributed.initialize`) each process feeds its own
slice of every global batch; pmap's collectives and jit's global arrays span all processes.
"""

from __future__ import annotations


import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from multiformer_common.errors import InvalidValue
from multiformer_jax.schema.sections import PARALLEL_MODES

AXIS = "batch"


class DataParallel:
  def __init__(self, mode: str = "pmap"):
    if mode not in PARALLEL_MODES:
      raise InvalidValue(f"train.parallel={mode!r}; valid: {PARALLEL_MODES}")
    self.mode = mode
    self.local_devices = jax.local_devices()
    self.num_local = len(self.local_devices)
    if mode == "jit":
      self.mesh = jax.make_mesh((jax.device_count(),), (AXIS,),
                                axis_types=(AxisType.Auto,))
      self.replicated = NamedSharding(self.mesh, PartitionSpec())
      self.sharded = NamedSharding(self.mesh, PartitionSpec(AXIS))
    else:                                                  # pmap's [local devices, ...]
      self.stacked = NamedSharding(jax.sharding.Mesh(np.array(self.local_devices), (AXIS,)),
                                   PartitionSpec(AXIS))

  @property
  def global_batch_multiple(self) -> int:
    """The local batch must divide into this many equal device slices."""
    return self.num_local

  def psum(self, tree):
    """Sum over the global batch inside a step function."""
    if self.mode == "pmap":
      return jax.lax.psum(tree, AXIS)
    return tree

  def per_device(self, fn):
    """jit: `fn(replicated, sliced)` run on each device with its slice of `sliced` (the batch),
    `replicated` whole -> (its first output stacked [devices, ...] and left on its device, its
    second as `fn` returns it, which must be the same on every device: psum it over AXIS).
    What pmap does with per-device outputs, for the gradients of an accumulated update."""
    if self.mode != "jit":
      raise InvalidValue("per_device is for train.parallel=jit; under pmap every output is per "
                       "device already")
    # check_vma=False: the varying-axis tracking would make a gradient of the replicated
    # input replicated too, that is all-reduce it here, the very thing this avoids.
    return jax.shard_map(fn, mesh=self.mesh, in_specs=(PartitionSpec(), PartitionSpec(AXIS)),
                         out_specs=(PartitionSpec(AXIS), PartitionSpec()), check_vma=False)

  def device_index(self):
    """A per-device integer inside a step (0 under jit, whose arrays are global)."""
    return jax.lax.axis_index(AXIS) if self.mode == "pmap" else 0

  def replicate(self, tree):
    """-> `tree` on every device: pmap's copies stacked on a leading axis of the local
    devices, jit's replicated over the mesh. From host values: a restored state's arrays sit
    on one device of this process, and moving them onto a mesh that spans processes would be
    a cross-host transfer. Nothing is compiled (flax's jax_utils.replicate stacks each leaf
    on a device: one small program per leaf shape, compiled in every process)."""
    host = jax.device_get(tree)
    if self.mode == "pmap":
      return jax.tree_util.tree_map(self._copy_to_local_devices, host)
    return jax.device_put(host, self.replicated)

  def _copy_to_local_devices(self, x) -> jax.Array:
    """A host array -> [local devices, ...] with one copy on each, as pmap takes it."""
    x = np.asarray(x)
    copies = [jax.device_put(x[None], device) for device in self.local_devices]
    return jax.make_array_from_single_device_arrays((self.num_local,) + x.shape, self.stacked,
                                                    copies)

  def unreplicate(self, tree):
    """-> host numpy arrays of one replica: this process's first device's, copied as it is.
    Not `x[0]`: indexing a pmap output compiles and runs a gather over the local devices (on
    CPU with a collective between them), and process 0 runs it alone when it scores the dev
    split while the others wait; a host read needs no program."""
    if self.mode != "pmap":
      return jax.device_get(tree)
    first = jax.device_get(jax.tree_util.tree_map(lambda x: x.addressable_data(0), tree))
    return jax.tree_util.tree_map(lambda x: x[0, ...], first)     # [1, ...] -> [...]

  def shard(self, batch: dict):
    """This process's batch (numpy, leading dim = local batch) -> device arrays."""
    if self.mode == "pmap":
      return jax.tree_util.tree_map(
          lambda x: x.reshape((self.num_local, x.shape[0] // self.num_local) + x.shape[1:]),
          batch)
    return jax.tree_util.tree_map(
        lambda x: jax.make_array_from_process_local_data(self.sharded, np.asarray(x)), batch)

  def batch_spec(self, layout: dict) -> dict:
    """{field: (shape, dtype)} of this process's batch -> the specs `shard` gives the steps
    (jax.ShapeDtypeStruct), to compile them ahead of the first batch."""
    if self.mode == "pmap":
      # Across processes pmap lowers from this process's arrays only (not shapes): zeros,
      # allocated lazily.
      spec = jax.ShapeDtypeStruct if jax.process_count() == 1 else np.zeros
      return {name: spec((self.num_local, shape[0] // self.num_local) + tuple(shape[1:]), dtype)
              for name, (shape, dtype) in layout.items()}
    return {name: jax.ShapeDtypeStruct((shape[0] * jax.process_count(),) + tuple(shape[1:]),
                                       dtype, sharding=self.sharded)
            for name, (shape, dtype) in layout.items()}

  @property
  def calls_compiled(self) -> bool:
    """Whether a program compiled ahead (`lower(...).compile()`) takes this process's batch:
    not with pmap across processes (its executable takes global arrays, which pmap's own call
    makes from the local ones): there compiling ahead only warms the compilation caches."""
    return self.mode == "jit" or jax.process_count() == 1

  def compile(self, fn, static_argnums=(), donate_argnums=()):
    """fn(state, batch, *static) -> compiled for this mode (state replicated, batch sharded)."""
    if self.mode == "pmap":
      return jax.pmap(fn, axis_name=AXIS, static_broadcasted_argnums=static_argnums,
                      donate_argnums=donate_argnums)
    return jax.jit(fn, static_argnums=static_argnums, donate_argnums=donate_argnums)

  def summing_program(self):
    """-> sum(local): a small integer vector of this process, summed over every device of every
    process by a collective (dispatched asynchronously: it runs on each device after the work
    queued before it). Read the result with `read_sum`. Every process must call it the same
    number of times, in the same order relative to the steps."""
    if self.mode == "pmap":
      summed = jax.pmap(lambda x: jax.lax.psum(x, AXIS), axis_name=AXIS)
      return lambda local: summed(np.broadcast_to(local, (self.num_local,) + local.shape))
    summed = jax.jit(lambda x: jax.numpy.sum(x, axis=0), out_shardings=self.replicated)
    return lambda local: summed(jax.make_array_from_process_local_data(
        self.sharded, np.broadcast_to(local, (self.num_local,) + local.shape)))

  @staticmethod
  def read_sum(summed) -> np.ndarray:
    """A `summing_program` result -> numpy (blocks until computed)."""
    summed = np.asarray(jax.device_get(summed))
    return summed[0] if summed.ndim > 1 else summed

  def scalar(self, x) -> float:
    """A replicated scalar metric -> float (blocks until computed)."""
    x = jax.device_get(x)
    return float(np.asarray(x).reshape(-1)[0])
