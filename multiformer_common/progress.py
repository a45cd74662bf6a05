"""Progress of long work: a tqdm bar on a terminal, a log line every so often elsewhere.

Written to a file (a redirected log, a CI job), a tqdm bar is one carriage-return-separated
line per refresh, thousands of them; there a `PeriodicProgress` logs one line
(`desc: n/total unit, rate, ETA`, formatted as the toolkit's log lines) on stderr at most
every `every_s` seconds, and one at the end.
"""

from __future__ import annotations

import sys
import time

LOG_EVERY_S = 60.0


def progress_bar(iterable=None, total: int | None = None, desc: str = "", unit: str = "it",
                 initial: int = 0, disable: bool = False, stream=None,
                 every_s: float = LOG_EVERY_S):
  """tqdm(...) where `stream` (default stderr) is a terminal, else a PeriodicProgress with
  tqdm's interface as the toolkit uses it (iteration, update, n, set_postfix, refresh,
  close)."""
  stream = sys.stderr if stream is None else stream
  if not disable and stream.isatty():
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial,
                dynamic_ncols=True, file=stream)
  return PeriodicProgress(iterable, total, desc, unit, initial, disable, every_s)


class PeriodicProgress:
  """A progress count that logs at most every `every_s` seconds (never when disabled)."""

  def __init__(self, iterable=None, total: int | None = None, desc: str = "", unit: str = "it",
               initial: int = 0, disable: bool = False, every_s: float = LOG_EVERY_S):
    self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
    if self.total is None and hasattr(iterable, "__len__"):
      self.total = len(iterable)
    self.n = self.start_n = initial
    self.disable, self.every_s = disable, every_s
    self.postfix = ""
    self.t0 = self.t_logged = time.time()

  def __iter__(self):
    """Counts an item as it is handed out, and logs the last line when the loop ends or is
    left (a `zip` with a shorter iterable never asks this one for its end)."""
    try:
      for item in self.iterable:
        self.update(1)
        yield item
    finally:
      self.close()

  def update(self, n: int = 1):
    self.n += n
    self.refresh(force=False)

  def set_postfix(self, refresh: bool = False, **values):
    self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())
    if refresh:
      self.refresh(force=False)

  def refresh(self, force: bool = False):
    now = time.time()
    if self.disable or (not force and now - self.t_logged < self.every_s):
      return
    self.t_logged = now
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    print(f"{stamp} INFO {self.line(now)}", file=sys.stderr, flush=True)

  def line(self, now: float) -> str:
    elapsed = max(now - self.t0, 1e-9)
    rate = (self.n - self.start_n) / elapsed
    count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
    text = f"{self.desc}: {count} {self.unit} ({rate:.2f} {self.unit}/s"
    if self.total and rate > 0:
      text += f", ETA {_duration((self.total - self.n) / rate)}"
    return text + ")" + (f" {self.postfix}" if self.postfix else "")

  def close(self):
    if self.n != self.start_n and time.time() - self.t_logged > 0:
      self.refresh(force=True)
    self.disable = True


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
      else f"{seconds // 60}:{seconds % 60:02d}"
