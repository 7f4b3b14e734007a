"""Writing Avro manifests quickly: one block per file, encoded into one buffer.

pyiceberg's manifest writer writes every entry as an Avro block of its own
(its own deflate call, count, size and sync marker) through an encoder that
writes each byte of a variable-length integer separately. A v3 commit writes
an entry per deletion vector it adds and per vector it replaces, so that cost
grows with the data files a commit touches. :class:`BufferedAvroOutput`
keeps pyiceberg's header and value writers (the bytes of every record are the
same) but collects the records and writes them as one block when the file is
closed, encoded by :class:`BufferEncoder` into a ``bytearray``. One block of
any number of records is plain Avro: every reader (Iceberg Java, DuckDB,
pyiceberg) reads it the same way.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from types import TracebackType
from typing import Any

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.file import _SCHEMA_KEY, MAGIC, META_SCHEMA, SYNC_SIZE, AvroFileHeader, AvroOutputFile
from pyiceberg.avro.resolver import construct_writer, resolve_writer
from pyiceberg.avro.writer import StructWriter, Writer
from pyiceberg.io import OutputFile
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.typedef import EMPTY_DICT, UTF8
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from lineage.identity_cache import struct_of
from lineage.storage.fileio import ImmutableFileCache


class BufferEncoder(BinaryEncoder):
    """An Avro binary encoder into an in-memory ``bytearray`` (:attr:`buffer`), byte for byte pyiceberg's encoding."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def write(self, b: bytes) -> None:
        """Append raw bytes."""
        self.buffer += b

    def write_boolean(self, boolean: bool) -> None:
        """One byte, 0 or 1."""
        self.buffer.append(1 if boolean else 0)

    def write_int(self, integer: int) -> None:
        """A zig-zag variable-length integer (Avro ``int`` and ``long``)."""
        datum = (integer << 1) ^ (integer >> 63)
        buf = self.buffer
        while datum & ~0x7F:
            buf.append((datum & 0x7F) | 0x80)
            datum >>= 7
        buf.append(datum)

    def write_bytes(self, b: bytes) -> None:
        """Length, then the bytes."""
        self.write_int(len(b))
        self.buffer += b

    def write_utf8(self, s: str) -> None:
        """Length, then the UTF-8 bytes."""
        self.write_bytes(s.encode(UTF8))


class BufferedAvroOutput(AvroOutputFile[Any]):
    """An :class:`~pyiceberg.avro.file.AvroOutputFile` that writes all its records as one block on close.

    ``written`` holds the records in the order written (the caller may keep
    them, e.g. to remember a manifest's entries without reading it back).
    The value writers and the header's Avro schema are built once per schema
    (pyiceberg builds both for every file, which costs more than writing a
    few entries).
    """

    def __init__(  # pyiceberg's signature; the parent's __init__ is not called: it would build the writers again
        self, output_file: OutputFile, file_schema: Schema, schema_name: str, record_schema: Schema | None = None,
        metadata: dict[str, str] = EMPTY_DICT, memo_field: str | None = None,
    ) -> None:
        self.output_file = output_file
        self.file_schema = file_schema
        self.schema_name = schema_name
        self.sync_bytes = os.urandom(SYNC_SIZE)
        self.metadata = metadata
        record = None if record_schema is None else struct_of(record_schema)

        def build() -> Writer:
            writer = construct_writer(file_schema) if record_schema is None else resolve_writer(record_schema, file_schema)
            return writer if memo_field is None else _memoized(writer, file_schema, memo_field)
        self.writer = _WRITERS.get((struct_of(file_schema), record, memo_field), build)
        self.written: list[Any] = []

    def _write_header(self) -> None:
        codec = self.metadata.get(AVRO_CODEC_KEY, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
        codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec, codec)
        schema = _AVRO_SCHEMAS.get(
            (struct_of(self.file_schema), self.schema_name),
            lambda: json.dumps(AvroSchemaConversion().iceberg_to_avro(self.file_schema, schema_name=self.schema_name)),
        )
        header = AvroFileHeader(MAGIC, {**self.metadata, _SCHEMA_KEY: schema, AVRO_CODEC_KEY: codec}, self.sync_bytes)
        _WRITERS.get(META_SCHEMA, lambda: construct_writer(META_SCHEMA)).write(self.encoder, header)

    def write_block(self, objects: list[Any]) -> None:
        """Collect ``objects``; they are encoded when the file is closed."""
        self.written.extend(objects)

    def __exit__(self, exctype: type[BaseException] | None, excinst: BaseException | None, exctb: TracebackType | None) -> None:
        """Write the collected records as one block (unless an exception is on its way), then close the file."""
        try:
            if exctype is None and self.written:
                self._flush()
        finally:
            super().__exit__(exctype, excinst, exctb)

    def _flush(self) -> None:
        body = BufferEncoder()
        for obj in self.written:
            self.writer.write(body, obj)
        content = bytes(body.buffer)
        head = BufferEncoder()
        head.write_int(len(self.written))
        codec = self.compression_codec()
        if codec:
            content, length = codec.compress(content)
            head.write_int(length)
        else:
            head.write_int(len(content))
        self.encoder.write(bytes(head.buffer) + content + self.sync_bytes)


class MemoWriter:
    """Writes a struct value as the bytes it was encoded to last time, when it is the same (immutable) object.

    A v3 commit rewrites the delete manifests holding the vectors it
    replaces: the same data-file structs, entry after entry, commit after
    commit, only their entries' status changing. The bytes are kept per
    object (a strong reference, so the id stays its own) for the last
    ``capacity`` objects written. (Not a pyiceberg ``Writer``: those are
    singletons per argument, which would share one memo between schemas.)
    """

    def __init__(self, inner: Writer, capacity: int = 50_000) -> None:
        self.inner = inner
        self.capacity = capacity
        self._bytes: OrderedDict[int, tuple[Any, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def write(self, encoder: BinaryEncoder, val: Any) -> None:
        """Encode ``val`` (or copy its earlier bytes)."""
        key = id(val)
        with self._lock:
            hit = self._bytes.get(key)
            if hit is not None and hit[0] is val:
                self._bytes.move_to_end(key)
                encoder.write(hit[1])
                return
        sub = BufferEncoder()
        self.inner.write(sub, val)
        data = bytes(sub.buffer)
        with self._lock:
            self._bytes[key] = (val, data)
            while len(self._bytes) > self.capacity:
                self._bytes.popitem(last=False)
        encoder.write(data)


def _memoized(writer: Writer, schema: Schema, name: str) -> Writer:
    """``writer`` (a struct writer of ``schema``) with the field ``name`` written through a :class:`MemoWriter`."""
    if not isinstance(writer, StructWriter):
        return writer
    position = [f.name for f in schema.fields].index(name)
    fields = list(writer.field_writers)
    pos, inner = fields[position]
    fields[position] = (pos, MemoWriter(inner))
    return StructWriter(field_writers=tuple(fields))


# Built per schema, not per file: value writers (stateless) and the JSON Avro schema of the header.
_WRITERS: ImmutableFileCache[Writer] = ImmutableFileCache(64)
_AVRO_SCHEMAS: ImmutableFileCache[str] = ImmutableFileCache(64)
