"""Results tables, written one way: the same rows as CSV (for scripts) and as a Markdown table
(for reading), side by side. The ablation table, the analyses' tables and a run's own results
all come from here."""

from __future__ import annotations

import csv
import os
from typing import Callable, NamedTuple, Sequence


class TablePaths(NamedTuple):
  md: str
  csv: str


def plain_cell(value) -> str:
  """A cell as the analyses show numbers: floats to 4 significant digits."""
  return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_table(rows: list[dict], path_base: str, columns: Sequence[str] | None = None,
                headers: Sequence[str] | None = None,
                cell: Callable[[str, object], str] | None = None,
                title: str = "") -> TablePaths:
  """rows -> {path_base}.csv and {path_base}.md: `columns` (default: the first row's keys) in
  both; the Markdown table shows `headers` (default: the column names), each cell as
  `cell(column, value)` gives it (default: plain_cell, with '|' escaped), under `title`."""
  columns = list(columns if columns is not None else rows[0])
  headers = list(headers if headers is not None else columns)
  cell = cell or (lambda column, value: plain_cell(value))
  directory = os.path.dirname(os.path.abspath(path_base))
  os.makedirs(directory, exist_ok=True)
  with open(path_base + ".csv", "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=columns)
    writer.writeheader()
    writer.writerows({c: row.get(c, "") for c in columns} for row in rows)
  lines = ([f"{title}\n"] if title else []) + [
      "| " + " | ".join(headers) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(cell(c, row.get(c, "")).replace("|", "\\|") for c in columns)
            + " |" for row in rows]
  with open(path_base + ".md", "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return TablePaths(md=path_base + ".md", csv=path_base + ".csv")
