"""Parsing of the CLI's argument values: schemas, durations, sizes, ``k=v`` pairs, timestamps.

Every function raises :class:`lineage.InvalidArgumentError` with a message that
names the option, so the CLI reports it as bad usage (exit code 2).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from collections.abc import Sequence

import pyarrow as pa

from lineage.errors import InvalidArgumentError

# Friendly names on top of pyarrow's own aliases (pa.type_for_alias).
_TYPE_ALIASES = {
    "int": "int32",
    "integer": "int32",
    "long": "int64",
    "bigint": "int64",
    "smallint": "int16",
    "tinyint": "int8",
    "real": "float32",
    "boolean": "bool",
    "varchar": "string",
    "text": "string",
    "bytes": "binary",
    "blob": "binary",
    "date": "date32",
    "timestamp": "timestamp[us]",
    "timestamptz": "timestamp[us, tz=UTC]",
    "time": "time64[us]",
}
_DECIMAL = re.compile(r"^decimal(?:128)?\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_TIMESTAMP = re.compile(r"^timestamp\[\s*(s|ms|us|ns)\s*(?:,\s*tz\s*=\s*([^\]]+?)\s*)?\]$")
_LIST = re.compile(r"^(?:list|array)<(.+)>$")


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets: ``"a:decimal(10,2),b"`` -> ``["a:decimal(10,2)", "b"]``."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([<{":
            depth += 1
        elif ch in ")]>}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def parse_type(text: str) -> pa.DataType:
    """An Arrow type from its name: ``int64``, ``string``, ``decimal(10,2)``, ``timestamp[us, tz=UTC]``, ``list<string>``."""
    raw = text.strip()
    name = _TYPE_ALIASES.get(raw.lower(), raw)
    m = _DECIMAL.match(name.lower())
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    m = _TIMESTAMP.match(name)
    if m:
        return pa.timestamp(m.group(1), tz=m.group(2))
    m = _LIST.match(name)
    if m:
        return pa.list_(parse_type(m.group(1)))
    try:
        return pa.type_for_alias(name.lower())
    except (ValueError, KeyError):
        pass
    raise InvalidArgumentError(
        f"unknown column type {raw!r}; use an Arrow type name such as int32, int64, float64, string, bool, date32, "
        "timestamp[us], timestamp[us, tz=UTC], decimal(10,2), binary or list<string>"
    )


def _field_from_spec(spec: str) -> pa.Field:
    if ":" not in spec:
        raise InvalidArgumentError(f"--schema: column {spec!r} needs a type, as name:type (e.g. id:int64)")
    name, typ = spec.split(":", 1)
    name, typ = name.strip(), typ.strip()
    nullable = True
    for suffix in ("!", " not null", " NOT NULL"):
        if typ.endswith(suffix):
            typ, nullable = typ[: -len(suffix)].strip(), False
    if not name:
        raise InvalidArgumentError(f"--schema: column {spec!r} has an empty name")
    return pa.field(name, parse_type(typ), nullable=nullable)


def _schema_from_json(obj: object, source: str) -> pa.Schema:
    """``{"fields": [{"name", "type", "nullable"}]}``, a list of such fields, or ``{"name": "type"}``."""
    if isinstance(obj, dict) and "fields" in obj:
        obj = obj["fields"]
    fields = []
    if isinstance(obj, dict):
        for name, typ in obj.items():
            if not isinstance(typ, str):
                raise InvalidArgumentError(f"--schema {source}: the type of {name!r} must be a string, got {typ!r}")
            fields.append(_field_from_spec(f"{name}:{typ}"))
    elif isinstance(obj, list):
        for item in obj:
            if not isinstance(item, dict) or "name" not in item or "type" not in item:
                raise InvalidArgumentError(f"--schema {source}: each field needs a name and a type, got {item!r}")
            fields.append(pa.field(str(item["name"]), parse_type(str(item["type"])), nullable=bool(item.get("nullable", True))))
    else:
        raise InvalidArgumentError(f"--schema {source}: expected a JSON object or list of fields")
    if not fields:
        raise InvalidArgumentError(f"--schema {source}: the schema has no columns")
    return pa.schema(fields)


def parse_schema(value: str) -> pa.Schema:
    """A schema from ``id:int64,name:string`` or from a file (JSON, Arrow IPC schema/stream/file, Parquet)."""
    if os.path.isfile(value):
        lower = value.lower()
        try:
            if lower.endswith(".json"):
                with open(value, encoding="utf-8") as fh:
                    return _schema_from_json(json.load(fh), value)
            if lower.endswith((".parquet", ".pq")):
                import pyarrow.parquet as pq

                return pq.read_schema(value).remove_metadata()
            with open(value, "rb") as fh:
                head = fh.read(6)
            if head == b"ARROW1":
                import pyarrow.ipc as ipc

                return ipc.open_file(value).schema.remove_metadata()
            try:
                with pa.memory_map(value) as src:
                    return pa.ipc.read_schema(src).remove_metadata()
            except pa.ArrowInvalid:
                with pa.OSFile(value) as src:
                    return pa.ipc.open_stream(src).schema.remove_metadata()
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"--schema {value}: not valid JSON: {exc}") from None
        except (pa.ArrowInvalid, OSError) as exc:
            raise InvalidArgumentError(f"--schema {value}: not a JSON, Arrow or Parquet schema file: {exc}") from None
    if value.lstrip().startswith(("{", "[")):
        try:
            return _schema_from_json(json.loads(value), "(inline JSON)")
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"--schema: not valid JSON: {exc}") from None
    specs = split_top_level(value)
    if not specs:
        raise InvalidArgumentError("--schema is empty; pass e.g. id:int64,name:string,amount:float64")
    fields = [_field_from_spec(s) for s in specs]
    names = [f.name for f in fields]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidArgumentError(f"--schema names column(s) {dup} more than once")
    return pa.schema(fields)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s|ms)", re.IGNORECASE)
_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(value: str, what: str) -> _dt.timedelta:
    """``7d``, ``12h``, ``1h30m``, ``90s``, ``2w``, ``0`` -> timedelta."""
    text = value.strip().lower()
    if text in ("0", "0s"):
        return _dt.timedelta(0)
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos and text[pos : m.start()].strip():
            break
        total += float(m.group(1)) * _UNITS[m.group(2).lower()]
        pos = m.end()
    if pos == 0 or text[pos:].strip():
        raise InvalidArgumentError(f"{what} must be a duration such as 7d, 12h, 30m, 1h30m or 0, got {value!r}")
    return _dt.timedelta(seconds=total)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)


def parse_size(value: str, what: str) -> int:
    """``134217728``, ``128MB``, ``64MiB``, ``1.5G`` -> bytes (K/M/G/T are powers of 1024)."""
    m = _SIZE.match(value)
    if not m:
        raise InvalidArgumentError(f"{what} must be a size in bytes such as 134217728, 128MB or 64MiB, got {value!r}")
    unit = (m.group(2) or "").lower().rstrip("b").rstrip("i")
    factor = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[unit]
    size = int(float(m.group(1)) * factor)
    if size <= 0:
        raise InvalidArgumentError(f"{what} must be positive, got {value!r}")
    return size


def parse_pairs(values: Sequence[str] | None, what: str) -> dict[str, str]:
    """``["k=v", "a=b"]`` -> ``{"k": "v", "a": "b"}``."""
    out: dict[str, str] = {}
    for item in values or []:
        if "=" not in item:
            raise InvalidArgumentError(f"{what} takes KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        if not k.strip():
            raise InvalidArgumentError(f"{what} has an empty key in {item!r}")
        out[k.strip()] = v
    return out


def parse_columns(value: str | None) -> list[str] | None:
    """``"id, name"`` -> ``["id", "name"]``; None stays None."""
    if value is None:
        return None
    cols = [c.strip() for c in value.split(",") if c.strip()]
    if not cols:
        raise InvalidArgumentError("--columns needs at least one column name")
    return cols


def parse_timestamp(value: str, what: str) -> object:
    """A timestamp for the change feed: ISO-8601, epoch milliseconds, or a duration ago (``2h`` = two hours ago)."""
    text = value.strip()
    if re.fullmatch(r"\d+", text):  # a bare number is epoch milliseconds (a duration ago needs its unit: 2h)
        return int(text)
    try:
        ts = _dt.datetime.fromisoformat(text)
    except ValueError:
        ts = None
    if ts is not None:
        return ts if ts.tzinfo else ts.replace(tzinfo=_dt.timezone.utc)
    try:
        ago = parse_duration(text, what)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"{what} must be an ISO-8601 time (2026-11-22T10:00:00Z), epoch milliseconds, "
            f"or a duration ago (2h, 7d), got {value!r}"
        ) from None
    return _dt.datetime.now(_dt.timezone.utc) - ago
