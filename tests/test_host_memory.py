"""host_memory: when the entry points re-execute with glibc.malloc.hugetlb=1, and that the
re-executed process keeps its arguments and does not loop."""

import os
import platform
import subprocess
import sys

import pytest

from multiformer_jax.runtime import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("environ, glibc, thp, expected", [
    ({}, (2, 36), "madvise", "glibc.malloc.hugetlb=1"),
    ({}, (2, 35), "always", "glibc.malloc.hugetlb=1"),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, (2, 36), "madvise",
     "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, (2, 36), "madvise", None),  # the user's own
    ({"MULTIFORMER_HUGE_PAGES": "0"}, (2, 36), "madvise", None),                # opted out
    ({"MULTIFORMER_HUGE_PAGES": "1"}, (2, 36), "madvise", "glibc.malloc.hugetlb=1"),
    ({}, (2, 34), "madvise", None),                                             # too old
    ({}, None, "madvise", None),                                                # not glibc
    ({}, (2, 36), "never", None),
    ({}, (2, 36), None, None),                                                  # unreadable
])
def test_environment_to_reexecute_with(environ, glibc, thp, expected):
  got = host_memory.huge_page_environment(environ, glibc, thp)
  if expected is None:
    assert got is None
  else:
    assert got == {**environ, "GLIBC_TUNABLES": expected}


def test_glibc_version_matches_the_platform_module():
  name, version = platform.libc_ver()
  expected = tuple(int(x) for x in version.split(".")[:2]) if name == "glibc" else None
  assert host_memory.glibc_version() == expected


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"),
                                        ("[always] madvise never\n", "always"),
                                        ("always madvise [never]\n", "never"),
                                        ("garbled\n", None)])
def test_reads_the_kernel_thp_mode(tmp_path, monkeypatch, text, mode):
  setting = tmp_path / "enabled"
  setting.write_text(text)
  monkeypatch.setattr(host_memory, "THP_SETTING", str(setting))
  assert host_memory.transparent_huge_pages() == mode
  monkeypatch.setattr(host_memory, "THP_SETTING", str(tmp_path / "missing"))
  assert host_memory.transparent_huge_pages() is None


SCRIPT = """
import os, sys
print("start", flush=True)
from multiformer_jax.runtime.host_memory import use_huge_pages
use_huge_pages()
print("done", sys.argv[1:], os.environ.get("GLIBC_TUNABLES", ""))
"""


@pytest.mark.parametrize("extra_env", [{}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"},
                                       {"MULTIFORMER_HUGE_PAGES": "0"}])
def test_reexecutes_once_with_the_same_arguments(extra_env):
  environ = {k: v for k, v in os.environ.items()
             if k not in ("GLIBC_TUNABLES", "MULTIFORMER_HUGE_PAGES")}
  environ.update(extra_env, PYTHONPATH=REPO)
  expected = host_memory.huge_page_environment(environ, host_memory.glibc_version(),
                                               host_memory.transparent_huge_pages())
  if not sys.platform.startswith("linux"):
    expected = None
  out = subprocess.run([sys.executable, "-c", SCRIPT, "first", "--second=2"], env=environ,
                       capture_output=True, text=True, timeout=120, check=True).stdout.split("\n")
  tunables = (expected or environ).get("GLIBC_TUNABLES", "")
  starts = 1 if expected is None else 2   # the re-executed process starts again, once
  assert out[:starts + 1] == ["start"] * starts + [
      f"done ['first', '--second=2'] {tunables}"], out
