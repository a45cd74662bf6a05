"""Transparent huge pages for XLA:CPU's buffers (Linux, glibc >= 2.35), set by the entry points.

XLA:CPU takes every output and temporary buffer of a step from malloc. glibc serves blocks above
its mmap threshold (32 MiB at most) with a fresh mmap and gives them back with munmap, so each
step touches its whole working set as new 4 KiB pages again: an s2t_transformer_s update on a
2-core CPU page-faults hundreds of thousands of times and spends a large share of its time in
the kernel. With the glibc tunable `glibc.malloc.hugetlb=1`, malloc asks the kernel for
transparent huge pages on those blocks (madvise) and the faults drop by two orders of
magnitude (benchmarks/train_step.py and benchmarks/page_faults.py; figures in
docs/benchmarks.md). Results do not change: only where the bytes live.

The tunable is read when the process starts, so `use_huge_pages()` re-executes the interpreter
once with it added to GLIBC_TUNABLES (same arguments, `-m` included). The command-line entry
points call it first; importing the library never does. Opt out with MULTIFORMER_HUGE_PAGES=0;
a GLIBC_TUNABLES that already names glibc.malloc.hugetlb is left as it is. On GPUs and TPUs
the device buffers come from XLA's own allocator; the tunable only concerns host memory there.
"""

from __future__ import annotations

import os
import sys

OPT_OUT_VARIABLE = "MULTIFORMER_HUGE_PAGES"   # "0": leave the allocator alone
TUNABLE = "glibc.malloc.hugetlb=1"
MIN_GLIBC = (2, 35)                            # first glibc with glibc.malloc.hugetlb
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def glibc_version() -> tuple[int, int] | None:
  """(major, minor) of the C library this interpreter runs on, None if it is not glibc."""
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()   # "glibc 2.36"
    major, minor = version.split(".")[:2]
    return (int(major), int(minor)) if name == "glibc" else None
  except (AttributeError, ValueError, OSError):
    return None


def transparent_huge_pages() -> str | None:
  """The kernel's THP mode ("always", "madvise" or "never"), None where it cannot be read."""
  try:
    with open(THP_SETTING, encoding="ascii") as f:
      setting = f.read()
  except OSError:
    return None
  start, end = setting.find("["), setting.find("]")
  return setting[start + 1:end] if 0 <= start < end else None


def huge_page_environment(environ, glibc: tuple[int, int] | None,
                          thp: str | None) -> dict | None:
  """The environment to re-execute with, or None when nothing should change: opted out, not
  glibc >= 2.35, THP off or unknown, or GLIBC_TUNABLES already names the tunable (which is
  also what stops the re-executed process from doing it again)."""
  if environ.get(OPT_OUT_VARIABLE, "1") == "0":
    return None
  if glibc is None or glibc < MIN_GLIBC or thp not in ("always", "madvise"):
    return None
  tunables = environ.get("GLIBC_TUNABLES", "")
  if "glibc.malloc.hugetlb" in tunables:
    return None
  return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, (tunables, TUNABLE)))}


def use_huge_pages() -> None:
  """Re-execute this process with glibc.malloc.hugetlb=1 where that helps (see the module
  docstring); returns only when nothing had to change. Call it before any work is done."""
  if not sys.platform.startswith("linux"):
    return
  environment = huge_page_environment(os.environ, glibc_version(), transparent_huge_pages())
  if environment is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)
