"""What the report (benchmarks/report.py) and the benchmarks' own report sections share: reading
a results file, Markdown tables, the machine and command lines of a run, the verdict of a target.
"""

from __future__ import annotations

import os
import re
import shlex

from benchmarks.common import read_results

MIB = 2 ** 20


def load(directory, name):
  path = os.path.join(directory, name)
  if not os.path.exists(path):
    return None, []
  return read_results(path)


def markdown_table(header, rows):
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def machine_line(meta):
  return (f"{meta.get('cpu', '?')} ({meta.get('cpu_count', '?')} cores, "
          f"{meta.get('platform', '?')}, {meta.get('devices', '?')} device), jax "
          f"{meta.get('jax', '?')}, Python {meta.get('python', '?')}, {meta.get('date', '?')}")


def command_line(command: str) -> str:
  """The recorded argv (joined with spaces) as a shell command line to run from the repository
  root, quoted where an argument holds ';' or parentheses."""
  words = command.split(" ")
  environment = []                      # leading VAR=value words stay before `python`
  while words and "=" in words[0] and not words[0].startswith("-"):
    environment.append(words.pop(0))
  script = re.match(r"(?:.*/)?benchmarks/(\w+)\.py$", words[0]) if words else None
  if script:                            # a benchmark runs as a module of the repository root
    words = ["python", "-m", f"benchmarks.{script.group(1)}"] + words[1:]
  command = shlex.join(words)
  if not command.startswith(("python", "/")):
    command = f"python {command}"
  return " ".join(environment + [command])


def options_cell(row) -> str:
  """The memory options of a train-step row: model.key_block_size and model.ffn_token_chunk
  (rows written before they existed ran the dense softmax and the unchunked FFN)."""
  block, chunk = row.get("key_block_size", 0), row.get("ffn_token_chunk", 0)
  return (f"key block {block or 'dense'}, FFN chunk {chunk or 'off'}")


def allocator(record) -> str:
  """How a run's process allocated host memory (benchmarks/common.machine records it; rows
  written before it did ran with glibc's defaults)."""
  tunables = (record or {}).get("glibc_tunables", "")
  return f"GLIBC_TUNABLES={tunables}" if tunables else "glibc's default malloc"


def verdict(ok):
  return "met" if ok else "**not met**"


def kind_rows(kinds, lengths, lookup, key, scale=1.0, fmt="{:.3f}", label="{}"):
  """Table rows [label(kind), row[key] / scale at each n] (a dash where not measured);
  lookup(kind, n) -> the result row or None."""
  def cell(row):
    return fmt.format(row[key] / scale) if row and row.get(key) is not None else "—"
  return [[label.format(kind)] + [cell(lookup(kind, n)) for n in lengths] for kind in kinds]


def forward_table(header, rows) -> str:
  """The forward-only seconds (rows written before attention.py timed them have none)."""
  if not rows:
    return ""
  return f"""
Forward only, seconds (what evaluation pays; same inputs, same run):

{markdown_table(header, rows)}
"""
