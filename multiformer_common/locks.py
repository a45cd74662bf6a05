"""One writer per directory: a training run's workdir, a corpus being prepared.

The lock is a file in the directory, `lock.json`, held with flock (the kernel frees it when
its holder dies, even by SIGKILL; shared filesystems pass it between hosts, NFSv4 and Lustre or
GPFS mounted with flock) and naming its holder: host, pid, start time, the SLURM job and
restart, and a heartbeat (the file's modification time, touched every HEARTBEAT_S). Where flock
is granted but the file names another holder, the holder is dead if it was on this host and its
process is gone, if it was an earlier incarnation of this SLURM job (a requeue), or if its
heartbeat is older than STALE_S (flock that does not reach across hosts); its lock is then
taken over, with a line that says so. Otherwise the directory is busy: `hold` refuses at once,
naming the holder; `wait` waits for it.

Released, the file is left empty (not removed: removing a file another process may be opening
would let two hold it).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time

from multiformer_common.errors import UserError

LOCK_FILE = "lock.json"
HEARTBEAT_S = 20.0
STALE_S = 120.0


class DirectoryBusy(UserError, OSError):
  """The directory is held by another live process."""


def _identity() -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "started": _process_start(),
          "slurm_job": os.environ.get("SLURM_JOB_ID", ""),
          "slurm_restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)}


def _process_start(pid: int | None = None) -> str:
  """A process's start time as the kernel has it (field 22 of /proc/PID/stat: tells a reused
  pid from the original), or '' where /proc is absent."""
  try:
    with open(f"/proc/{pid or os.getpid()}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return ""


def describe(holder: dict) -> str:
  when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
  job = f", SLURM job {holder['slurm_job']}" if holder.get("slurm_job") else ""
  return f"{holder.get('what', 'a process')} on host {holder.get('host')} (pid " \
         f"{holder.get('pid')}{job}, since {when})"


def dead_because(holder: dict, heartbeat_age: float, me: dict) -> str | None:
  """Why the holder named in a lock file whose flock was granted is dead, or None if it may
  still be alive."""
  if holder.get("host") == me["host"]:
    pid = int(holder.get("pid", 0))
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return "its process is gone"
    except PermissionError:
      pass                       # another user's live process
    if holder.get("started") and _process_start(pid) != holder.get("started"):
      return "its process is gone (the pid is another process's now)"
    return None
  if (me["slurm_job"] and holder.get("slurm_job") == me["slurm_job"] and
      int(holder.get("slurm_restart", 0)) < me["slurm_restart"]):
    return f"it was this SLURM job before its requeue (restart {holder.get('slurm_restart')})"
  if heartbeat_age > STALE_S:
    return f"its heartbeat stopped {heartbeat_age:.0f} s ago"
  return None


class DirectoryLock:
  """`with DirectoryLock(directory, "training").hold():` -> this process is the directory's
  only writer until the block ends (see the module's docstring)."""

  def __init__(self, directory: str, what: str):
    self.directory = directory
    self.path = os.path.join(directory, LOCK_FILE)
    self.what = what
    self._fd = None
    self._stop = threading.Event()
    self._beat = None

  def _try(self) -> tuple[bool, dict, float]:
    """-> (acquired, the holder the file names, seconds since its heartbeat)."""
    os.makedirs(self.directory, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      acquired = True
    except BlockingIOError:
      acquired = False
    try:
      holder = json.loads(os.pread(fd, 1 << 16, 0).decode("utf-8") or "{}")
    except ValueError:
      holder = {}                 # a torn write: nobody
    age = time.time() - os.fstat(fd).st_mtime
    if acquired:
      self._fd = fd
    else:
      os.close(fd)
    return acquired, holder, age

  def _take(self, holder: dict, age: float, log: logging.Logger) -> str | None:
    """With the flock held: takes the lock unless the file names a live holder; -> None, or
    why it is busy."""
    me = _identity()
    if holder:
      dead = dead_because(holder, age, me)
      if dead is None:
        return (f"{describe(holder)}, last heartbeat {age:.0f} s ago: if it is dead, its "
                f"lock is taken over once its heartbeat is {STALE_S:.0f} s old, or remove "
                f"{self.path}")
      log.warning("%s: taking over the lock of %s: %s", self.directory, describe(holder), dead)
    os.ftruncate(self._fd, 0)
    os.pwrite(self._fd, json.dumps({**me, "what": self.what, "since": time.time()}).encode(), 0)
    os.fsync(self._fd)
    self._beat = threading.Thread(target=self._heartbeat, daemon=True, name="lock heartbeat")
    self._beat.start()
    return None

  def _heartbeat(self):
    while not self._stop.wait(HEARTBEAT_S):
      try:
        os.utime(self.path)
      except OSError:
        pass

  def acquire(self, wait: bool = False, log: logging.Logger | None = None):
    """Takes the lock; if another live process holds it: with `wait`, waits for it (a line
    every minute), else raises DirectoryBusy naming it."""
    log = log or logging.getLogger("multiformer_jax")
    said = 0.0
    while True:
      acquired, holder, age = self._try()
      busy = self._take(holder, age, log) if acquired else \
          f"{describe(holder)}, last heartbeat {age:.0f} s ago"
      if busy is None:
        return self
      if acquired:
        os.close(self._fd)
        self._fd = None
      if not wait:
        raise DirectoryBusy(f"{self.directory} is in use by {busy}. One {self.what} writes "
                            f"there at a time: wait for it to end, stop it, or choose another "
                            f"directory")
      if time.monotonic() - said > 60:
        log.info("%s is in use by %s: waiting for it", self.directory, busy)
        said = time.monotonic()
      time.sleep(1.0)

  def release(self):
    if self._fd is None:
      return
    self._stop.set()
    os.ftruncate(self._fd, 0)
    fcntl.flock(self._fd, fcntl.LOCK_UN)
    os.close(self._fd)
    self._fd = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.release()
    return False
