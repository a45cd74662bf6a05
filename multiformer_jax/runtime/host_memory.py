"""Host memory for XLA:CPU's buffers, set up by the entry points: tcmalloc where the system has
it, and transparent huge pages (Linux, glibc >= 2.35).

XLA:CPU takes every output and temporary buffer of a step from malloc. glibc serves blocks above
its mmap threshold (32 MiB at most) with a fresh mmap and gives them back with munmap, so each
step touches its whole working set as new 4 KiB pages again: an s2t_transformer_s update on a
2-core CPU page-faults hundreds of thousands of times and spends a large share of its time in
the kernel. With the glibc tunable `glibc.malloc.hugetlb=1`, malloc asks the kernel for
transparent huge pages on those blocks (madvise) and the faults drop by two orders of
magnitude (benchmarks/train_step.py and benchmarks/page_faults.py; figures in
docs/benchmarks.md). Results do not change: only where the bytes live.

glibc still maps XLA's largest block of each step afresh: a block above the mmap threshold
that a worker thread's arena cannot hold, for instance the quickstart update's 103 MiB of
temporaries, is mmapped, faulted in and unmapped at every step. gperftools' tcmalloc keeps such
blocks for the next step: where its library is installed (Debian/Ubuntu:
`apt install libtcmalloc-minimal4`) or `run.py` has unpacked Debian's package into the user's
cache without root (`fetch_tcmalloc`), the entry points preload it, and the quickstart's CPU
update runs 1.11x faster, an s2t_transformer_s update 1.08x (docs/benchmarks.md). glibc's tunables that
would keep the block (one arena, no mmap) serialise the threads on one lock and run slower.

Both settings are read when the process starts, so `set_up_host_allocator()` re-executes the
interpreter once with them added to LD_PRELOAD and GLIBC_TUNABLES (same arguments, `-m`
included). The command-line entry points call it first; importing the library never does.
Opt out with MULTIFORMER_TCMALLOC=0 and MULTIFORMER_HUGE_PAGES=0; an LD_PRELOAD that already
names tcmalloc and a GLIBC_TUNABLES that already names glibc.malloc.hugetlb are left as they
are. On GPUs and TPUs the device buffers come from XLA's own allocator; these settings only
concern host memory there.
"""

from __future__ import annotations

import os
import subprocess
import sys

from multiformer_common import packages

OPT_OUT_VARIABLE = "MULTIFORMER_HUGE_PAGES"   # "0": leave glibc's tunables alone
TCMALLOC_OPT_OUT_VARIABLE = "MULTIFORMER_TCMALLOC"   # "0": do not preload tcmalloc
TUNABLE = "glibc.malloc.hugetlb=1"
TCMALLOC_LIBRARIES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
TCMALLOC_PACKAGE = "libtcmalloc-minimal4"     # Debian's, unpacked by fetch_tcmalloc
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                "/usr/lib", "/usr/local/lib")
PACKAGE_LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu")   # Debian's
# gperftools reports every allocation above 1 GiB on stderr; XLA's temporaries often are.
TCMALLOC_QUIET = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(2 ** 62)}
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


def library_cache() -> str:
  """Where `fetch_tcmalloc` unpacks Debian's package: beside the embedded corpus's packages
  (~/.cache/multiformer_jax/libraries, under XDG_CACHE_HOME where that is set)."""
  return os.path.join(packages.cache_root(), "libraries")


def cached_library_dirs(cache: str | None = None) -> tuple[str, ...]:
  """The library folders of the package unpacked in `cache` (default: library_cache())."""
  root = os.path.join(cache or library_cache(), TCMALLOC_PACKAGE)
  return tuple(os.path.join(root, directory) for directory in PACKAGE_LIBRARY_DIRS)


def find_tcmalloc(directories=None) -> str | None:
  """The path of a tcmalloc library (gperftools): the system's, else the one fetch_tcmalloc
  unpacked; None where there is none."""
  if directories is None:
    directories = LIBRARY_DIRS + cached_library_dirs()
  for directory in directories:
    for name in TCMALLOC_LIBRARIES:
      path = os.path.join(directory, name)
      if os.path.isfile(path):
        return path
  return None


def fetch_tcmalloc(environ=os.environ, cache: str | None = None, log=None) -> str | None:
  """The tcmalloc library to preload, unpacking Debian's libtcmalloc-minimal4 into `cache`
  (default: library_cache(); apt-get download + dpkg-deb -x, no root) where the system has
  none. None where nothing is to be preloaded: not Linux, opted out (MULTIFORMER_TCMALLOC=0),
  LD_PRELOAD already naming a tcmalloc, or the package cannot be had, which one line on stderr
  (or `log`) names; the run then goes on with glibc's malloc."""
  if not sys.platform.startswith("linux") or not _wants_tcmalloc(environ):
    return None
  cache = cache or library_cache()
  directories = LIBRARY_DIRS + cached_library_dirs(cache)
  found = find_tcmalloc(directories)
  if found:
    return found
  try:
    packages.fetch(TCMALLOC_PACKAGE, cache)
    problem = (f"{TCMALLOC_PACKAGE} unpacked into {cache} holds none of "
               f"{', '.join(TCMALLOC_LIBRARIES)}")
  except (packages.PackageUnavailable, OSError, subprocess.SubprocessError) as error:
    problem = str(error)
  found = find_tcmalloc(directories)   # another process may have unpacked it meanwhile
  if found is None:
    (log or _warn)(f"tcmalloc not preloaded, glibc's malloc instead (the quickstart's CPU update "
                   f"runs about 1.1x slower; {TCMALLOC_OPT_OUT_VARIABLE}=0 skips this): {problem}")
  return found


def _wants_tcmalloc(environ) -> bool:
  """Not opted out (MULTIFORMER_TCMALLOC=0), and LD_PRELOAD names no tcmalloc yet."""
  return (environ.get(TCMALLOC_OPT_OUT_VARIABLE, "1") != "0"
          and "tcmalloc" not in environ.get("LD_PRELOAD", ""))


def _warn(line: str) -> None:
  print(f"WARNING: {line}", file=sys.stderr, flush=True)


def tcmalloc_environment(environ, tcmalloc: str | None) -> dict | None:
  """The environment that preloads `tcmalloc`, or None when nothing should change: opted out,
  no library, or LD_PRELOAD already names a tcmalloc (which is also what stops the
  re-executed process from doing it again)."""
  preload = environ.get("LD_PRELOAD", "")
  if not tcmalloc or not _wants_tcmalloc(environ):
    return None
  quiet = {k: v for k, v in TCMALLOC_QUIET.items() if k not in environ}
  return {**environ, **quiet, "LD_PRELOAD": " ".join(filter(None, (preload, tcmalloc)))}


def host_allocator_environment(environ, glibc: tuple[int, int] | None, thp: str | None,
                               tcmalloc: str | None) -> dict | None:
  """The environment to re-execute with (huge pages and tcmalloc, each where it applies), or
  None when nothing should change."""
  huge_pages = huge_page_environment(environ, glibc, thp)
  both = tcmalloc_environment(huge_pages or environ, tcmalloc)
  return both or huge_pages


def describe(environ=os.environ) -> str:
  """One line for the logs: the host allocator this process runs with."""
  preload = next((p for p in environ.get("LD_PRELOAD", "").replace(":", " ").split()
                  if "tcmalloc" in p), None)
  tunables = environ.get("GLIBC_TUNABLES", "")
  huge = f"GLIBC_TUNABLES={tunables}" if "glibc.malloc.hugetlb" in tunables else "no huge pages"
  if preload:
    return f"tcmalloc ({preload})"
  return (f"glibc malloc, {huge} (tcmalloc would be preloaded where installed: "
          f"apt install {TCMALLOC_PACKAGE}, or run.py fetches it into {library_cache()}; "
          f"opt out: {TCMALLOC_OPT_OUT_VARIABLE}=0)")


def reexecution_environment(environ=os.environ) -> dict | None:
  """The environment set_up_host_allocator re-executes a process started with `environ` in on
  this machine (with the tcmalloc found now), or None where it does not re-execute it."""
  if not sys.platform.startswith("linux"):
    return None
  return host_allocator_environment(environ, glibc_version(), transparent_huge_pages(),
                                    find_tcmalloc())


def set_up_host_allocator() -> None:
  """Re-execute this process with tcmalloc preloaded and glibc.malloc.hugetlb=1, each where it
  helps (see the module docstring); returns only when nothing had to change. Call it before
  any work is done."""
  environment = reexecution_environment()
  if environment is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)
