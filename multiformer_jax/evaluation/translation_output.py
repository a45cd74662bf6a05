"""Where `translate` writes its results: readable text on stdout, or a TSV / JSONL file that
a rerun appends to, skipping the files already in it.

Each result is one line (JSONL: {"path", "segments", "asr", "st"}; TSV: the same columns under
a header line, tabs and newlines in texts written as spaces), written and flushed as soon as
the file is decoded. A line cut short by a killed run is dropped when the file is reopened.
"""

from __future__ import annotations

import json
import os
import sys

from multiformer_common.errors import InvalidValue

FORMATS = ("text", "tsv", "jsonl")
EXTENSIONS = {".tsv": "tsv", ".jsonl": "jsonl"}
STAGE_LABELS = {"asr": "transcript", "st": "translation"}


def output_format(path: str | None, fmt: str | None) -> str:
  """The format to write: `fmt`, else from the output file's extension, else text (stdout).
  Text is for reading on stdout only; a file is TSV or JSONL."""
  if path is None:
    return fmt or "text"
  ext = os.path.splitext(path)[1].lower()
  fmt = fmt or EXTENSIONS.get(ext)
  if fmt is None:
    raise InvalidValue(f"--output {path}: name a .tsv or .jsonl file, or pass --format tsv|jsonl")
  if fmt == "text":
    raise InvalidValue(f"--output {path} --format text: a results file is tsv or jsonl (text is "
                     f"for stdout, without --output)")
  return fmt


def _lines_kept(path: str) -> list[str]:
  """The complete lines of `path`; a last line without its newline (a killed run) is dropped
  from the file."""
  with open(path, "rb") as f:
    data = f.read()
  complete = data[:data.rfind(b"\n") + 1]
  if len(complete) != len(data):
    with open(path, "r+b") as f:
      f.truncate(len(complete))
  return complete.decode("utf-8").splitlines()


def paths_written(path: str, fmt: str) -> set[str]:
  """The audio paths that an earlier run already wrote to the results file `path`."""
  if not os.path.exists(path):
    return set()
  lines = _lines_kept(path)
  if fmt == "jsonl":
    done = set()
    for number, line in enumerate(lines, 1):
      try:
        done.add(json.loads(line)["path"])
      except (ValueError, KeyError, TypeError) as error:
        raise InvalidValue(f"{path} line {number} is not a translate result ({error}): give "
                         f"another --output or remove the file") from None
    return done
  if lines and lines[0].split("\t")[0] != "path":
    raise InvalidValue(f"{path} has no 'path' header: not a translate TSV; give another "
                     f"--output or remove the file")
  return {line.split("\t")[0] for line in lines[1:] if line}


class ResultWriter:
  """Writes results to stdout (path None) or appends them to a file, one flushed line each."""

  def __init__(self, path: str | None, fmt: str, stages):
    self.fmt, self.stages = fmt, tuple(stages)
    self.path = path
    if path is None:
      self.stream = sys.stdout
    else:
      directory = os.path.dirname(os.path.abspath(path))
      os.makedirs(directory, exist_ok=True)
      fresh = not os.path.exists(path) or os.path.getsize(path) == 0
      self.stream = open(path, "a", encoding="utf-8", newline="")
      if fresh and fmt == "tsv":
        self._tsv_row(["path", "segments", *self.stages])

  def write(self, result: dict):
    if self.fmt == "jsonl":
      self.stream.write(json.dumps({k: result[k] for k in ("path", "segments", *self.stages)},
                                   ensure_ascii=False) + "\n")
    elif self.fmt == "tsv":
      self._tsv_row([result["path"], result["segments"], *(result[s] for s in self.stages)])
    else:
      lines = [f"{result['path']} ({result['segments']} segment(s))"]
      lines += [f"  {STAGE_LABELS[s]:<12}{result[s]}" for s in self.stages]
      self.stream.write("\n".join(lines) + "\n")
    self.stream.flush()

  def _tsv_row(self, values):
    cells = [str(v).replace("\t", " ").replace("\n", " ").replace("\r", " ") for v in values]
    self.stream.write("\t".join(cells) + "\n")
    self.stream.flush()

  def close(self):
    if self.path is not None:
      self.stream.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False
