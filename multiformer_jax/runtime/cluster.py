"""Where a process of a multi-process run stands: its coordinator, rank and devices.

Under SLURM (one `srun` task per process) every GPU of every node is used, whichever layout the
job asks for:
- one task per node (`--ntasks-per-node=1`): the task takes every GPU it sees;
- one task per GPU (`--ntasks-per-node=G`, `--gpus-per-task=1`): the task takes its own GPU,
  the one SLURM binds it to, or the SLURM_LOCALID-th of those the node's tasks share;
- k GPUs per task: its k, likewise.
A bare `jax.distributed.initialize()` would give each process the SLURM_LOCALID-th GPU alone
(JAX's SLURM detection assumes one GPU per task): 2 nodes x 8 GPUs with one task per node would
train on 2 GPUs. `slurm_settings` reads the same variables and passes the devices explicitly.

The coordinator is the step's first node, on JAX_COORDINATOR_PORT or a port derived from the
job id, as JAX's own SLURM detection picks it.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from multiformer_common.errors import InvalidValue


def is_slurm(env: Mapping[str, str] = os.environ) -> bool:
  return all(k in env for k in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID",
                                "SLURM_LOCALID"))


def expand_counts(value: str) -> list[int]:
  """SLURM's per-node counts, '2(x3),1' -> [2, 2, 2, 1]."""
  counts = []
  for item in filter(None, value.split(",")):
    match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
    if not match:
      raise InvalidValue(f"cannot read SLURM's per-node count {value!r} (item {item!r})")
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts


def first_host(nodelist: str) -> str:
  """The first host of a SLURM node list: 'gpu[003-005,9],cpu1' -> 'gpu003'."""
  match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
  if not match:
    raise InvalidValue(f"cannot read SLURM's node list {nodelist!r}")
  prefix, ranges = match.groups()
  return prefix if ranges is None else prefix + re.split(r"[,-]", ranges)[0]


def tasks_on_this_node(env: Mapping[str, str]) -> int:
  """How many tasks of the step run on this node."""
  per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
  if per_node:
    counts = expand_counts(per_node)
    node = int(env.get("SLURM_NODEID", "0"))
    if node < len(counts):
      return counts[node]
  if env.get("SLURM_NTASKS_PER_NODE"):
    return int(env["SLURM_NTASKS_PER_NODE"])
  return 1


def visible_gpus(env: Mapping[str, str]) -> int | None:
  """How many GPUs this task sees: CUDA_VISIBLE_DEVICES's entries where set (SLURM sets it for
  the GPUs it gives the task), else the node's GPUs as the driver lists them; None where
  neither tells."""
  listed = env.get("CUDA_VISIBLE_DEVICES")
  if listed is not None:
    return len([d for d in listed.split(",") if d.strip()])
  try:
    return len(os.listdir("/proc/driver/nvidia/gpus")) or None
  except OSError:
    return None


def slurm_local_devices(env: Mapping[str, str] = os.environ) -> list[int] | None:
  """The indices, among the GPUs this SLURM task sees, of those it trains on (see the module's
  docstring); None: every device it sees (on a CPU, or where the GPUs cannot be counted).
  JAX_LOCAL_DEVICE_IDS (e.g. '0,1,2,3') decides where it is set: a layout this cannot tell
  from the variables, such as tasks bound to several GPUs each by --gpu-bind alone."""
  if env.get("JAX_LOCAL_DEVICE_IDS"):
    return [int(i) for i in env["JAX_LOCAL_DEVICE_IDS"].split(",")]
  visible = visible_gpus(env)
  tasks = tasks_on_this_node(env)
  local = int(env["SLURM_LOCALID"])
  if visible is None or tasks == 1:
    return None
  per_task = env.get("SLURM_GPUS_PER_TASK", "")
  per_task = int(per_task.split(":")[-1]) if per_task.split(":")[-1].isdigit() else None
  if per_task == visible or visible < tasks:
    return None                  # SLURM bound this task to its own GPUs: it sees only those
  if visible % tasks:
    raise InvalidValue(
        f"SLURM runs {tasks} tasks on this node, which sees {visible} GPUs "
        f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}): they do not divide "
        f"evenly; ask for one task per node (--ntasks-per-node=1) or one per GPU "
        f"(--ntasks-per-node={visible} --gpus-per-task=1)")
  share = visible // tasks
  return list(range(local * share, (local + 1) * share))


def slurm_settings(env: Mapping[str, str] = os.environ) -> dict:
  """jax.distributed.initialize's arguments for this SLURM task (JAX's own detection off)."""
  port = env.get("JAX_COORDINATOR_PORT") or \
      str(int(env["SLURM_JOB_ID"]) % 2 ** 12 + (65535 - 2 ** 12 + 1))
  nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or \
      env.get("SLURM_NODELIST")
  if not nodelist:
    raise InvalidValue("SLURM_STEP_NODELIST is not set: start the processes with srun")
  return {"coordinator_address": f"{first_host(nodelist)}:{port}",
          "num_processes": int(env["SLURM_NTASKS"]), "process_id": int(env["SLURM_PROCID"]),
          "local_device_ids": slurm_local_devices(env),
          "cluster_detection_method": "deactivate"}


def describe_process(jax) -> str:
  """'process 1 of 2 on host gpu004: 8 local devices (gpu: 0-7), 16 in all'."""
  import socket  # pylint: disable=import-outside-toplevel
  local = jax.local_devices()
  ids = [d.id for d in local]
  return (f"process {jax.process_index()} of {jax.process_count()} on host "
          f"{socket.gethostname()}: {len(local)} local devices ({local[0].platform}: "
          f"{', '.join(map(str, ids))}), {jax.device_count()} in all")
