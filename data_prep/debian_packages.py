"""Debian packages unpacked into a cache, without root: `apt-get download` + `dpkg-deb -x`.

The embedded corpus's text (Ding, the Bible) and its extra synthesizers (flite, festival) are
GPL or public-domain data fetched when the corpus is built, never committed. Each package is
unpacked once into `{cache}/{package}` (atomically: a folder is there only when complete).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile


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
    download = subprocess.run(["apt-get", "download", package], cwd=work, capture_output=True,
                              text=True, check=False)
    debs = [f for f in os.listdir(work) if f.endswith(".deb")]
    if download.returncode or not debs:
      raise PackageUnavailable(f"apt-get download {package} failed "
                               f"({download.stderr.strip()[-300:]}); run 'apt-get update' "
                               f"first, or install {package}")
    unpacked = os.path.join(work, "unpacked")
    subprocess.run(["dpkg-deb", "-x", os.path.join(work, debs[0]), unpacked], check=True,
                   capture_output=True)
    os.replace(unpacked, root)
  return root


def fetch_all(packages, cache_dir: str) -> dict[str, str]:
  """{package: its folder} for every package (PackageUnavailable at the first missing one)."""
  return {package: fetch(package, cache_dir) for package in packages}
