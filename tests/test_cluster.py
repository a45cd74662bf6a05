"""A cluster launch that uses every device: the devices each SLURM layout gives a task, read
from the variables as SLURM sets them, and two CPU processes with two devices each started the
way srun starts them (no flag but SLURM's variables) training together."""

import re
import subprocess

import pytest

from multiformer_jax.runtime import cluster
from tests.test_reliability import _communicate, _free_port, _run, _write_config
from tests.test_train import devices_flag


def slurm(tasks_per_node, nodes, rank, **extra):
  """SLURM's variables for task `rank` of a step of `tasks_per_node` tasks on each of `nodes`
  nodes (as srun exports them)."""
  per_node = f"{tasks_per_node}(x{nodes})" if nodes > 1 else str(tasks_per_node)
  return {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": str(tasks_per_node * nodes),
          "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % tasks_per_node),
          "SLURM_NODEID": str(rank // tasks_per_node), "SLURM_STEP_TASKS_PER_NODE": per_node,
          "SLURM_TASKS_PER_NODE": per_node, "SLURM_STEP_NODELIST": "gpu[007-008]",
          "SLURM_STEP_NUM_NODES": str(nodes), **extra}


def test_one_task_per_node_takes_every_gpu_of_its_node():
  for rank in range(2):
    env = slurm(1, 2, rank, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    settings = cluster.slurm_settings(env)
    assert settings["local_device_ids"] is None           # all eight it sees, not GPU 0
    assert settings["num_processes"] == 2 and settings["process_id"] == rank
    assert settings["coordinator_address"] == f"gpu007:{4242 % 4096 + 61440}"
    assert settings["cluster_detection_method"] == "deactivate"


def test_one_task_per_gpu_takes_its_own():
  # Every task sees the node's eight GPUs: each takes the SLURM_LOCALID-th.
  for rank in (0, 5, 11):
    env = slurm(8, 2, rank, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    assert cluster.slurm_local_devices(env) == [rank % 8]
  # --gpus-per-task=1 binds each task to its GPU, which it sees as its only one.
  env = slurm(8, 2, 13, CUDA_VISIBLE_DEVICES="5", SLURM_GPUS_PER_TASK="1")
  assert cluster.slurm_local_devices(env) is None
  # Two GPUs per task, unbound: the task's share of the node's.
  assert cluster.slurm_local_devices(slurm(4, 1, 3, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")) \
      == [6, 7]
  # JAX_LOCAL_DEVICE_IDS decides a layout the variables cannot tell.
  env = slurm(2, 1, 1, CUDA_VISIBLE_DEVICES="0,1,2,3", JAX_LOCAL_DEVICE_IDS="0,1,2,3")
  assert cluster.slurm_local_devices(env) == [0, 1, 2, 3]


def test_layouts_that_cannot_share_the_gpus_evenly_are_named():
  with pytest.raises(ValueError, match=r"3 tasks on this node, which sees 8 GPUs.*"
                                       r"--ntasks-per-node=1"):
    cluster.slurm_local_devices(slurm(3, 1, 0, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"))


def test_slurm_lists_are_read_as_slurm_writes_them():
  assert cluster.expand_counts("2(x3),1") == [2, 2, 2, 1]
  assert cluster.first_host("gpu[003-005,9],cpu1") == "gpu003"
  assert cluster.first_host("node17,node18") == "node17"
  assert cluster.tasks_on_this_node({"SLURM_STEP_TASKS_PER_NODE": "4,2",
                                     "SLURM_NODEID": "1"}) == 2
  with pytest.raises(ValueError, match="per-node count"):
    cluster.expand_counts("2(y3)")


def test_two_processes_started_as_srun_starts_them_train_on_every_device(prepared, tmp_path):
  """No --distributed and no coordinator flag: SLURM's variables alone (one task per node, each
  process with two devices), as `srun python run.py ...` gives them."""
  config_file = _write_config(tmp_path / "tiny_slurm.py", prepared[1], 2, 2, "pmap")
  port = str(_free_port())
  processes = []
  for rank in range(2):
    env = {**slurm(1, 2, rank), "SLURM_STEP_NODELIST": "localhost", "JAX_COORDINATOR_PORT": port,
           "XLA_FLAGS": devices_flag(2)}
    processes.append(_run(config_file, str(tmp_path / "run"), env_update=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
  logs = _communicate(processes)
  for rank, (process, log) in enumerate(zip(processes, logs)):
    assert process.returncode == 0, log[-3000:]
    assert re.search(rf"process {rank} of 2 on host \S+: 2 local devices \(cpu: \d+, \d+\), "
                     rf"4 in all", log), log[-3000:]
    assert "devices: 2 local (cpu), 2 processes" in log
  checksums = {re.search(r"parameter checksum (\w+)", log).group(1) for log in logs}
  assert len(checksums) == 1
