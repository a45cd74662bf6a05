"""The package cache and Debian packages unpacked into it, without root: `apt-get download` +
`dpkg-deb -x`.

One cache root, `cache_root()` (~/.cache/multiformer_jax, under XDG_CACHE_HOME where that is
set), holds everything fetched at run time: the embedded corpus's text (the message catalogs'
wheels under wheels/, the Ding dictionary and the Bible), its synthesizers (synthesizers/) and
run.py's tcmalloc (libraries/). They are GPL, public-domain or non-free data fetched when
needed, never committed. Each Debian package is unpacked once into `{cache}/{package}`
(atomically: a folder is there only when complete).

A package the machine's apt sources do not offer (MBROLA's voices are in Debian's non-free
section, Ubuntu's multiverse; most machines list main only) is looked up again in a private apt
state under the cache: the machine's own archives with every section (WIDER_COMPONENTS), read
by `apt-get update` into `{cache}/apt-sections`, which needs no root and leaves the machine's
apt as it was.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile

WIDER_COMPONENTS = ("main", "contrib", "non-free", "universe", "multiverse")
SOURCES = ("/etc/apt/sources.list", "/etc/apt/sources.list.d")


def cache_root() -> str:
  """~/.cache/multiformer_jax, or $XDG_CACHE_HOME/multiformer_jax where that is set."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "multiformer_jax")


class PackageUnavailable(RuntimeError):
  """A package could not be fetched here (no apt, or the download failed)."""


def fetch(package: str, cache_dir: str) -> str:
  """The folder `{cache_dir}/{package}` holding the package's unpacked files, fetched if it is
  not there yet. Raises PackageUnavailable saying what is missing and how to get it."""
  root = os.path.join(cache_dir, package)
  if os.path.isdir(root):
    return root
  missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
  if missing:
    raise PackageUnavailable(f"{' and '.join(missing)} not found: {package} is a Debian package "
                             f"(apt-get download {package}; dpkg-deb -x it into {root})")
  os.makedirs(cache_dir, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=cache_dir) as work:
    error = _download(package, work, [])
    if error:
      options = wider_apt_options(cache_dir)
      if options and not _download(package, work, options):
        error = ""
    if error:
      raise PackageUnavailable(f"apt-get download {package} failed ({error[-300:]}); run "
                               f"'apt-get update' first, or install {package}")
    deb = next(f for f in sorted(os.listdir(work)) if f.endswith(".deb"))
    unpacked = os.path.join(work, "unpacked")
    subprocess.run(["dpkg-deb", "-x", os.path.join(work, deb), unpacked], check=True,
                   capture_output=True)
    return move_into_place(unpacked, root)
  return root


def move_into_place(staging: str, final: str) -> str:
  """Renames the complete folder `staging` to `final` and returns `final`. If another process
  put its own complete copy there first (two runs fetching one package at once), that copy is
  kept and `staging` removed: a folder in the cache is only ever there whole."""
  try:
    os.replace(staging, final)
  except OSError:
    if not os.path.isdir(final):
      raise
    shutil.rmtree(staging, ignore_errors=True)
  return final


def fetch_all(packages, cache_dir: str) -> dict[str, str]:
  """{package: its folder} for every package (PackageUnavailable at the first missing one)."""
  return {package: fetch(package, cache_dir) for package in packages}


def _download(package: str, work: str, options) -> str:
  """apt-get download into `work`; "" when a .deb came, else apt's complaint."""
  done = subprocess.run(["apt-get", *options, "download", package], cwd=work,
                        capture_output=True, text=True, check=False)
  if not done.returncode and any(f.endswith(".deb") for f in os.listdir(work)):
    return ""
  return done.stderr.strip() or f"exit {done.returncode}"


def archive_entries(paths) -> list[tuple[str, str, str]]:
  """(options, URI, suite) of every binary archive in apt's sources (one-line `.list` files
  and deb822 `.sources` files); options is the one-line form's "[...]" or ""."""
  files = []
  for path in paths:
    files += sorted(glob.glob(os.path.join(path, "*"))) if os.path.isdir(path) else [path]
  entries = []
  for path in files:
    try:
      with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    except OSError:
      continue
    if path.endswith(".sources"):
      for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
        if "deb" not in fields.get("Types", "").split():
          continue
        signed = fields.get("Signed-By", "")
        options = f"[signed-by={signed}]" if signed.startswith("/") else ""
        entries += [(options, uri, suite) for uri in fields.get("URIs", "").split()
                    for suite in fields.get("Suites", "").split()]
    elif path.endswith(".list"):
      for line in text.splitlines():
        match = re.match(r"^\s*deb\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
        if match:
          entries.append(((match.group(1) or "").strip(), match.group(2), match.group(3)))
  return entries


_WIDER = {}


def wider_apt_options(cache_dir: str) -> list[str]:
  """apt options reading a private state under `cache_dir` whose sources are the machine's
  archives with every section of WIDER_COMPONENTS, updated once per process; [] where the
  machine lists no archive or the update fails."""
  if cache_dir in _WIDER:
    return _WIDER[cache_dir]
  entries = archive_entries(SOURCES)
  root = os.path.join(cache_dir, "apt-sections")
  options = []
  if entries:
    for sub in ("lists/partial", "archives/partial"):
      os.makedirs(os.path.join(root, sub), exist_ok=True)
    sources = os.path.join(root, "sources.list")
    with open(sources, "w", encoding="utf-8") as f:
      f.writelines(" ".join(filter(None, ("deb", opts, uri, suite, *WIDER_COMPONENTS))) + "\n"
                   for opts, uri, suite in dict.fromkeys(entries))
    options = ["-o", f"Dir::State::Lists={root}/lists", "-o", f"Dir::Cache={root}",
               "-o", f"Dir::Cache::archives={root}/archives", "-o",
               f"Dir::Etc::SourceList={sources}", "-o", "Dir::Etc::SourceParts=/nonexistent"]
    update = subprocess.run(["apt-get", *options, "update"], capture_output=True, text=True,
                            check=False)
    if update.returncode:
      options = []
  _WIDER[cache_dir] = options
  return options
