"""host_memory: when the entry points re-execute with glibc.malloc.hugetlb=1 and tcmalloc
preloaded, and that the re-executed process keeps its arguments and does not loop."""

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


TCMALLOC = "/usr/lib/libtcmalloc_minimal.so.4"


@pytest.mark.parametrize("environ, expected", [
    ({}, {"LD_PRELOAD": TCMALLOC, "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(2 ** 62)}),
    ({"LD_PRELOAD": "/x/libfoo.so", "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "1000"},
     {"LD_PRELOAD": f"/x/libfoo.so {TCMALLOC}"}),                      # the user's own kept
    ({"LD_PRELOAD": "/opt/libtcmalloc.so"}, None),                       # already preloaded
    ({"MULTIFORMER_TCMALLOC": "0"}, None),                               # opted out
])
def test_environment_that_preloads_tcmalloc(environ, expected):
  got = host_memory.tcmalloc_environment(environ, TCMALLOC)
  assert got == (None if expected is None else {**environ, **expected})
  assert host_memory.tcmalloc_environment(environ, None) is None      # not installed


def test_both_settings_together_and_each_alone():
  both = host_memory.host_allocator_environment({}, (2, 36), "madvise", TCMALLOC)
  assert both["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and both["LD_PRELOAD"] == TCMALLOC
  only_tunable = host_memory.host_allocator_environment({}, (2, 36), "madvise", None)
  assert only_tunable == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  only_preload = host_memory.host_allocator_environment({}, None, None, TCMALLOC)
  assert "GLIBC_TUNABLES" not in only_preload and only_preload["LD_PRELOAD"] == TCMALLOC
  assert host_memory.host_allocator_environment(both, (2, 36), "madvise", TCMALLOC) is None


def test_describes_the_allocator_for_the_logs():
  preloaded = {"LD_PRELOAD": f"/x/libfoo.so {TCMALLOC}"}
  assert host_memory.describe(preloaded) == f"tcmalloc ({TCMALLOC})"
  line = host_memory.describe({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
  assert line.startswith("glibc malloc, GLIBC_TUNABLES=glibc.malloc.hugetlb=1")
  assert "apt install libtcmalloc-minimal4" in line and "MULTIFORMER_TCMALLOC=0" in line
  assert f"run.py fetches it into {host_memory.library_cache()}" in line
  assert host_memory.describe({}).startswith("glibc malloc, no huge pages")


def test_finds_tcmalloc_in_the_library_directories(tmp_path):
  assert host_memory.find_tcmalloc([str(tmp_path)]) is None
  (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
  assert host_memory.find_tcmalloc([str(tmp_path)]) == str(tmp_path / "libtcmalloc.so.4")
  (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")            # the minimal one first
  assert host_memory.find_tcmalloc([str(tmp_path)]) == str(tmp_path / "libtcmalloc_minimal.so.4")


def test_finds_the_library_fetched_into_the_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  cache = tmp_path / "multiformer_jax" / "libraries"
  assert host_memory.library_cache() == str(cache)
  library = cache / "libtcmalloc-minimal4" / "usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
  monkeypatch.setattr(host_memory, "LIBRARY_DIRS", (str(tmp_path / "system"),))  # none there
  assert host_memory.find_tcmalloc() is None
  library.parent.mkdir(parents=True)
  library.write_bytes(b"")
  assert host_memory.find_tcmalloc() == str(library)
  (tmp_path / "system").mkdir()
  (tmp_path / "system" / "libtcmalloc.so.4").write_bytes(b"")        # the system's comes first
  assert host_memory.find_tcmalloc() == str(tmp_path / "system" / "libtcmalloc.so.4")


def _stand_in_apt(bin_dir, calls):
  """apt-get and dpkg-deb on PATH: `apt-get download` writes a .deb and logs the call to
  `calls`; `dpkg-deb -x DEB DIR` unpacks a tcmalloc library into DIR."""
  scripts = {
      "apt-get": f"""import sys
open({str(calls)!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
open(sys.argv[2] + "_2.10-1_amd64.deb", "wb").write(b"deb")""",
      "dpkg-deb": """import os, sys
target = os.path.join(sys.argv[3], "usr/lib/x86_64-linux-gnu")
os.makedirs(target)
open(os.path.join(target, "libtcmalloc_minimal.so.4"), "wb").write(b"")"""}
  bin_dir.mkdir()
  for name, body in scripts.items():
    path = bin_dir / name
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(0o755)


def test_fetches_tcmalloc_once_into_the_cache(monkeypatch, tmp_path):
  calls = tmp_path / "apt-calls"
  _stand_in_apt(tmp_path / "bin", calls)
  monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setattr(host_memory, "LIBRARY_DIRS", (str(tmp_path / "system"),))
  cache, said = str(tmp_path / "cache"), []
  expected = os.path.join(cache, "libtcmalloc-minimal4", "usr/lib/x86_64-linux-gnu",
                          "libtcmalloc_minimal.so.4")
  for environ in ({"MULTIFORMER_TCMALLOC": "0"}, {"LD_PRELOAD": "/opt/libtcmalloc.so"}):
    assert host_memory.fetch_tcmalloc(environ, cache, said.append) is None   # nothing wanted
  assert not calls.exists() and not os.path.exists(cache)
  if not sys.platform.startswith("linux"):
    return
  assert host_memory.fetch_tcmalloc({}, cache, said.append) == expected
  assert host_memory.fetch_tcmalloc({}, cache, said.append) == expected     # from the cache
  assert calls.read_text() == "download libtcmalloc-minimal4\n" and said == []
  # What the entry points preload is then the fetched library.
  preload = host_memory.tcmalloc_environment({}, host_memory.find_tcmalloc(
      host_memory.cached_library_dirs(cache)))
  assert preload["LD_PRELOAD"] == expected


def test_without_apt_the_run_goes_on_with_glibc_and_says_why(monkeypatch, tmp_path):
  if not sys.platform.startswith("linux"):
    pytest.skip("tcmalloc is fetched on Linux only")
  monkeypatch.setattr(host_memory, "LIBRARY_DIRS", (str(tmp_path / "system"),))
  monkeypatch.setenv("PATH", str(tmp_path / "empty"))                  # no apt-get, no dpkg-deb
  said = []
  assert host_memory.fetch_tcmalloc({}, str(tmp_path / "cache"), said.append) is None
  assert len(said) == 1 and said[0].startswith("tcmalloc not preloaded, glibc's malloc instead")
  assert "apt-get and dpkg-deb not found" in said[0] and "libtcmalloc-minimal4" in said[0]
  assert "MULTIFORMER_TCMALLOC=0" in said[0]


SCRIPT = """
import os, sys
print("start", flush=True)
from multiformer_jax.runtime.host_memory import set_up_host_allocator
set_up_host_allocator()
print("done", sys.argv[1:], os.environ.get("GLIBC_TUNABLES", ""), os.environ.get("LD_PRELOAD", ""))
"""


@pytest.mark.parametrize("extra_env", [
    {}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, {"MULTIFORMER_HUGE_PAGES": "0"},
    {"MULTIFORMER_HUGE_PAGES": "0", "MULTIFORMER_TCMALLOC": "0"}])
def test_reexecutes_once_with_the_same_arguments(extra_env):
  environ = {k: v for k, v in os.environ.items()
             if k not in ("GLIBC_TUNABLES", "MULTIFORMER_HUGE_PAGES", "MULTIFORMER_TCMALLOC",
                          "LD_PRELOAD")}
  environ.update(extra_env, PYTHONPATH=REPO)
  expected = host_memory.reexecution_environment(environ)
  out = subprocess.run([sys.executable, "-c", SCRIPT, "first", "--second=2"], env=environ,
                       capture_output=True, text=True, timeout=120, check=True).stdout.split("\n")
  final = expected or environ
  starts = 1 if expected is None else 2   # the re-executed process starts again, once
  assert out[:starts + 1] == ["start"] * starts + [
      f"done ['first', '--second=2'] {final.get('GLIBC_TUNABLES', '')} "
      f"{final.get('LD_PRELOAD', '')}"], out
