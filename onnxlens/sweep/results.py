"""DIR/results.jsonl (one row per line, appended and flushed as each finishes) and
DIR/results.csv, and what a re-run with the same DIR skips.

Resuming: the rows that finished `ok` are kept and skipped; error rows are dropped and run
again (a backend missing then may be there now). A line cut short by a crash is dropped. When
anything is dropped the file is rewritten through a temporary file and a rename, so no row that
finished is ever lost and none appears twice.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from ..analyzer.serialize import safe_cell
from .tasks import ROW_FIELDS, row_key

RESULTS = "results.jsonl"
RESULTS_CSV = "results.csv"
HOST_FIELDS = ("name", "cpu", "isa")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a results.jsonl; a line that does not parse (cut short) is left out."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and all(k in row for k in ROW_FIELDS):
            rows.append(row)
    return rows


class ResultsLog:
    """The results.jsonl of one sweep directory, open for appending."""

    def __init__(self, out: Path) -> None:
        self.path = out / RESULTS
        out.mkdir(parents=True, exist_ok=True)
        kept: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in read_rows(self.path):
            if row["status"] == "ok":
                kept.setdefault(row_key(row), row)
        self.rows = list(kept.values())
        kept_bytes = _jsonl(self.rows)
        if self.path.is_file() and self.path.read_bytes() != kept_bytes:
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_bytes(kept_bytes)
            os.replace(tmp, self.path)
        self.done = set(kept)
        self._file: IO[bytes] = self.path.open("ab")

    def append(self, row: dict[str, Any]) -> None:
        self._file.write(encode_row(row) + b"\n")
        self._file.flush()
        self.rows.append(row)

    def close(self) -> None:
        self._file.close()


def encode_row(row: Mapping[str, Any]) -> bytes:
    import orjson  # compact, one line (the rows come from TOML and numbers: no lone surrogate)

    return orjson.dumps({k: row[k] for k in ROW_FIELDS})


def _jsonl(rows: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(encode_row(r) + b"\n" for r in rows)


def write_csv(rows: Iterable[Mapping[str, Any]], path: Path) -> None:
    """The rows for spreadsheets: `host` spread over host_name, host_cpu, host_isa; every text
    cell formula-escaped (`serialize.safe_cell`)."""
    columns = [c for c in ROW_FIELDS if c != "host"] + [f"host_{h}" for h in HOST_FIELDS]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\r\n")
    writer.writeheader()
    for row in rows:
        host = row.get("host") or {}
        flat = {**{c: row.get(c) for c in ROW_FIELDS if c != "host"},
                **{f"host_{h}": host.get(h) for h in HOST_FIELDS}}
        writer.writerow({c: safe_cell(v) for c, v in flat.items()})
    path.write_text(buffer.getvalue(), encoding="utf-8")
