"""Output formats and progress bars of the ``lineage`` CLI.

Results are either *tabular* (a pyarrow Table: scans, change feeds, the commit
log) or a *record* (a dict: table info, what a maintenance run did). Both can
be written as an aligned text table, JSON, CSV or Parquet.

Progress bars (rich) go to stderr, only when stderr is a terminal and the
user did not pass ``--quiet``; they are transient, so nothing is left behind.
``LINEAGE_PROGRESS=never|always`` overrides the terminal check.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import decimal
import json
import math
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any

import pyarrow as pa

from lineage.errors import InvalidArgumentError

FORMATS = ("table", "json", "csv", "parquet")
BATCH_ROWS = 10_000
PROGRESS_MIN_ROWS = 200_000  # writing fewer rows than this is quick: no bar


# ---------------------------------------------------------------- values


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB'."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _iso(ts: _dt.datetime | _dt.date | _dt.time) -> str:
    if isinstance(ts, _dt.datetime):
        spec = "milliseconds" if ts.microsecond % 1000 == 0 else "microseconds"
        text = ts.isoformat(sep=" ", timespec=spec)
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    return ts.isoformat()


def json_default(value: Any) -> Any:
    """JSON encoding of the Python values pyarrow returns."""
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)


def cell(value: Any) -> str:
    """One value as text for the aligned table format."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return repr(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return _iso(value)
    if isinstance(value, (bytes, bytearray)):
        hexed = value.hex()
        return "0x" + (hexed if len(hexed) <= 32 else hexed[:32] + "...")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(cell(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, default=json_default)
    return str(value)


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _flat_types(t: pa.DataType) -> bool:
    return not (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_struct(t)
        or pa.types.is_map(t)
        or pa.types.is_fixed_size_list(t)
    )


def _stringify_nested(table: pa.Table) -> pa.Table:
    """CSV cannot hold lists or structs: write them as JSON text."""
    for i, f in enumerate(table.schema):
        if not _flat_types(f.type):
            values = [None if v is None else json.dumps(v, default=json_default) for v in table.column(i).to_pylist()]
            table = table.set_column(i, pa.field(f.name, pa.string()), pa.array(values, pa.string()))
    return table


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists of records become JSON text)."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, (Mapping, list, tuple)) for x in v):
            out[key] = json.dumps(v, default=json_default)
        else:
            out[key] = v
    return out


# ---------------------------------------------------------------- progress


def progress_enabled(quiet: bool) -> bool:
    """Bars only on a terminal, never with --quiet (``LINEAGE_PROGRESS`` overrides the terminal check)."""
    if quiet:
        return False
    forced = os.environ.get("LINEAGE_PROGRESS", "").lower()
    if forced in ("never", "0", "no", "false"):
        return False
    if forced in ("always", "1", "yes", "true"):
        return True
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


class Task:
    """Handle of one progress bar (a no-op when progress is off)."""

    def __init__(self, progress: Any = None, task_id: Any = None) -> None:
        self._progress = progress
        self._id = task_id

    def advance(self, n: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._id, n)

    def update(self, description: str | None = None, total: float | None = None, completed: float | None = None) -> None:
        if self._progress is None:
            return
        kwargs: dict[str, Any] = {}
        if description is not None:
            kwargs["description"] = description
        if total is not None:
            kwargs["total"] = total
        if completed is not None:
            kwargs["completed"] = completed
        self._progress.update(self._id, **kwargs)


class Progress:
    """Transient progress bars on stderr. ``with progress.task("compacting"): ...``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._live: Any = None

    @contextlib.contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[Task]:
        """A bar for a piece of work: determinate with ``total``, a pulsing bar and a timer without."""
        if not self.enabled:
            yield Task()
            return
        if self._live is not None:  # nested: one more line in the same display
            tid = self._live.add_task(description, total=total)
            try:
                yield Task(self._live, tid)
            finally:
                self._live.remove_task(tid)
            return
        from rich.console import Console
        from rich.progress import BarColumn, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress
        from rich.text import Text

        class Count(ProgressColumn):
            """``12/40`` for work with a known size, nothing for a pulsing bar."""

            def render(self, task: Any) -> Text:
                if task.total is None:
                    return Text("")
                return Text(f"{int(task.completed):,}/{int(task.total):,}", style="progress.download")

        force = os.environ.get("LINEAGE_PROGRESS", "").lower() in ("always", "1", "yes", "true")
        console = Console(stderr=True, force_terminal=True if force else None)
        columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), Count(), TimeElapsedColumn()]
        with RichProgress(*columns, console=console, transient=True, refresh_per_second=8) as live:
            self._live = live
            try:
                tid = live.add_task(description, total=total)
                yield Task(live, tid)
            finally:
                self._live = None


# ---------------------------------------------------------------- writers


class Output:
    """Writes results in the chosen format to stdout or ``--output FILE``."""

    def __init__(self, fmt: str, path: str | None, progress: Progress) -> None:
        if fmt not in FORMATS:
            raise InvalidArgumentError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if fmt == "parquet" and not path:
            raise InvalidArgumentError("--format parquet writes a binary file: pass --output FILE (or --output - for stdout)")
        self.fmt = fmt
        self.path = None if path in (None, "-") else path
        self.binary_stdout = path == "-"
        self.progress = progress

    @contextlib.contextmanager
    def _text(self) -> Iterator[IO[str]]:
        if self.path is None:
            yield sys.stdout
            sys.stdout.flush()
        else:
            with open(self.path, "w", encoding="utf-8", newline="") as fh:
                yield fh

    # ------------------------------------------------------------ tabular
    def table(self, data: pa.Table, *, empty_note: str | None = None) -> None:
        """Write a tabular result."""
        total = data.num_rows
        bar = (
            self.progress.task(f"writing {total:,} rows", total=total)
            if total >= PROGRESS_MIN_ROWS
            else contextlib.nullcontext(Task())
        )
        with bar as task:
            self._write(data.schema, data.to_batches(max_chunksize=BATCH_ROWS), task, empty_note)

    def stream(self, reader: pa.RecordBatchReader, *, empty_note: str | None = None) -> None:
        """Write a tabular result batch by batch as ``reader`` yields it (memory holds one batch)."""
        batches = (b.slice(k, BATCH_ROWS) for b in reader for k in range(0, b.num_rows, BATCH_ROWS))
        with self.progress.task("writing rows") as task:
            self._write(reader.schema, batches, task, empty_note)

    def json_lines(self, readers: Iterable[pa.RecordBatchReader]) -> None:
        """Each reader's rows as JSON lines (one object per line), flushed after each reader: for a feed that is followed."""
        with self._text() as out:
            for reader in readers:
                for batch in reader:
                    out.write("".join(json.dumps(r, default=json_default) + "\n" for r in batch.to_pylist()))
                out.flush()

    def _write(self, schema: pa.Schema, batches: Iterable[pa.RecordBatch], task: Task,
               empty_note: str | None) -> None:
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            sink: Any = sys.stdout.buffer if self.binary_stdout else self.path
            with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
                for batch in batches:
                    writer.write_batch(batch)
                    task.advance(batch.num_rows)
            return
        with self._text() as out:
            if self.fmt == "table":
                written = self._write_aligned(out, schema, iter(batches), task)
                if written == 0 and empty_note and out is sys.stdout:
                    print(f"({empty_note})", file=out)
            elif self.fmt == "json":
                self._write_json(out, batches, task)
            else:
                self._write_csv(out, schema, batches, task)

    def _write_aligned(self, out: IO[str], schema: pa.Schema, batches: Iterator[pa.RecordBatch], task: Task) -> int:
        """Columns aligned to the widths of the first batch's values; returns the rows written."""
        names = schema.names
        right = [_is_numeric(f.type) for f in schema]
        first = next(batches, None)
        rows = [] if first is None else first.to_pylist()
        widths = [len(n) for n in names]
        for row in rows:
            for i, n in enumerate(names):
                widths[i] = max(widths[i], len(cell(row[n])))

        def line(values: Sequence[str]) -> str:
            return "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)).rstrip()

        out.write(line(names) + "\n")
        out.write(line(["-" * w for w in widths]) + "\n")
        written = 0
        while rows:
            out.write("".join(line([cell(r[n]) for n in names]) + "\n" for r in rows))
            task.advance(len(rows))
            written += len(rows)
            batch = next(batches, None)
            rows = [] if batch is None else batch.to_pylist()
        return written

    def _write_json(self, out: IO[str], batches: Iterable[pa.RecordBatch], task: Task) -> None:
        out.write("[")
        first = True
        for batch in batches:
            rows = batch.to_pylist()
            for r in rows:
                out.write(("\n" if first else ",\n") + json.dumps(r, default=json_default))
                first = False
            task.advance(len(rows))
        out.write("\n]\n" if not first else "]\n")

    def _write_csv(self, out: IO[str], schema: pa.Schema, batches: Iterable[pa.RecordBatch], task: Task) -> None:
        import io

        import pyarrow.csv as pacsv

        buf = io.BytesIO()
        pacsv.write_csv(_stringify_nested(schema.empty_table()), buf)
        out.write(buf.getvalue().decode())
        for batch in batches:
            buf = io.BytesIO()
            pacsv.write_csv(_stringify_nested(pa.Table.from_batches([batch])), buf, pacsv.WriteOptions(include_header=False))
            out.write(buf.getvalue().decode())
            task.advance(batch.num_rows)

    # ------------------------------------------------------------ records
    def record(self, record: Mapping[str, Any], *, text: str | None = None) -> None:
        """Write a non-tabular result; ``text`` replaces the generic rendering in the table format."""
        if self.fmt == "table":
            with self._text() as out:
                out.write(text if text is not None else render_record(record))
            return
        if self.fmt == "json":
            with self._text() as out:
                out.write(json.dumps(record, indent=2, default=json_default) + "\n")
            return
        flat = flatten(record)
        if self.fmt == "csv":
            import csv

            with self._text() as out:
                w = csv.writer(out, lineterminator="\n")
                w.writerow(["key", "value"])
                for k, v in flat.items():
                    w.writerow(
                        [
                            k,
                            ""
                            if v is None
                            else (json.dumps(v, default=json_default) if isinstance(v, (list, tuple)) else cell(v)),
                        ]
                    )
            return
        row = {k: (json.dumps(v, default=json_default) if isinstance(v, (list, tuple)) else v) for k, v in flat.items()}
        self.table(pa.Table.from_pylist([row]))


def render_record(record: Mapping[str, Any], indent: int = 0) -> str:
    """A record as aligned ``key  value`` lines; nested records indent, lists of records become small tables."""
    pad = " " * indent
    keys = [str(k) for k in record]
    width = max((len(k) for k in keys), default=0)
    lines = []
    for k, v in record.items():
        if isinstance(v, Mapping):
            lines.append(f"{pad}{k}:")
            lines.append(render_record(v, indent + 2).rstrip("\n"))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, Mapping) for x in v):
            lines.append(f"{pad}{k}:")
            lines.append(_small_table(v, indent + 2))
        elif isinstance(v, (list, tuple)) and len(v) > 4:
            lines.append(f"{pad}{k}:")
            lines.extend(f"{pad}  {cell(x)}" for x in v)
        else:
            lines.append(f"{pad}{str(k).ljust(width)}  {cell(v) if not isinstance(v, str) else v}".rstrip())
    return "\n".join(lines) + "\n"


def _small_table(rows: Sequence[Mapping[str, Any]], indent: int) -> str:
    names: list[str] = []
    for r in rows:
        for k in r:
            if k not in names:
                names.append(k)
    texts = [[cell(r.get(n)) if not isinstance(r.get(n), str) else r.get(n) for n in names] for r in rows]
    right = [all(isinstance(r.get(n), (int, float)) and not isinstance(r.get(n), bool) for r in rows) for n in names]
    widths = [max([len(n)] + [len(t[i]) for t in texts]) for i, n in enumerate(names)]
    pad = " " * indent

    def line(values: Sequence[str]) -> str:
        return pad + "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)).rstrip()

    return "\n".join([line(names), line(["-" * w for w in widths])] + [line(t) for t in texts])
