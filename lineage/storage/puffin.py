"""Iceberg v3 deletion vectors: Puffin files holding ``deletion-vector-v1`` blobs.

The on-disk format is the Puffin spec's, version 1 (the magic ``PFA1`` at both
ends of the file names it), with the blob type ``deletion-vector-v1``:

- a Puffin file is ``PFA1``, the blobs, then the footer ``PFA1``, a UTF-8 JSON
  payload, the payload's size (4 bytes, little-endian), 4 bytes of flags and
  ``PFA1`` again;
- a deletion vector blob is the length of magic plus vector (4 bytes,
  big-endian), the magic ``D1 D3 39 64``, the positions as a portable 64-bit
  Roaring bitmap (the number of 32-bit bitmaps as 8 bytes little-endian, then
  per bitmap, by ascending key, the key as 4 bytes little-endian and a 32-bit
  Roaring bitmap in the portable format), and the CRC-32 of magic plus vector
  (4 bytes, big-endian);
- the footer describes each blob: ``type``, ``fields`` (the reserved ``pos``
  field), ``snapshot-id`` and ``sequence-number`` (-1: not known when the file
  is written), ``offset``, ``length`` and the ``properties``
  ``referenced-data-file`` and ``cardinality``.

A delete-file manifest entry points at one blob (``referenced_data_file``,
``content_offset``, ``content_size_in_bytes``), so a reader fetches a vector
with one ranged read and never parses the footer (:func:`read_deletion_vector`).
Positions are sorted unique ``int64`` numpy arrays both ways.
"""

from __future__ import annotations

import array
import json
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from pyiceberg.io import FileIO
from pyroaring import BitMap

import lineage.storage.fileio as fileio
import lineage.storage.files as files
from lineage.errors import InvalidArgumentError, PuffinFormatError

PUFFIN_MAGIC = b"PFA1"
DV_MAGIC = bytes((0xD1, 0xD3, 0x39, 0x64))
DV_BLOB_TYPE = "deletion-vector-v1"
ROW_POSITION_FIELD_ID = 2147483645  # the reserved field id of ``_pos``, the field a vector is computed for (as Iceberg Java writes)
CREATED_BY = "iceberg-row-lineage"

_FOOTER_TAIL = 12  # payload size, flags, magic
_COMPRESSED_FLAG = 0x01
_COOKIE_NO_RUNS = 12346
_COOKIE_RUNS = 12347
_NO_OFFSET_THRESHOLD = 4
_EMPTY = np.zeros(0, np.int64)


@dataclass(frozen=True)
class DeletionVectorBlob:
    """Where one deletion vector lives: what a delete-file manifest entry of format PUFFIN records.

    ``path`` and ``file_size_in_bytes`` are the Puffin file's;
    ``content_offset`` and ``content_size_in_bytes`` the blob's byte range in
    it; ``record_count`` is the vector's cardinality (the rows it deletes).
    """

    path: str
    file_size_in_bytes: int
    referenced_data_file: str
    content_offset: int
    content_size_in_bytes: int
    record_count: int


@dataclass(frozen=True)
class PuffinBlobMetadata:
    """One blob as a Puffin footer describes it."""

    type: str
    fields: tuple[int, ...]
    snapshot_id: int
    sequence_number: int
    offset: int
    length: int
    compression_codec: str | None
    properties: dict[str, str]


# --- the blob -------------------------------------------------------------------------------------------------


def _positions(positions: Iterable[int] | np.ndarray) -> np.ndarray:
    pos = np.asarray(positions if isinstance(positions, np.ndarray) else list(positions), dtype=np.int64)
    if pos.ndim != 1:
        raise InvalidArgumentError(f"deletion vector positions are a flat array, got shape {pos.shape}")
    if len(pos) > 1 and not bool(np.all(pos[1:] > pos[:-1])):  # sorted and unique already: the common case
        pos = np.sort(pos)
        pos = pos[np.concatenate(([True], pos[1:] != pos[:-1]))]
    if len(pos) and pos[0] < 0:
        raise InvalidArgumentError(f"a deletion vector holds positions >= 0, got {int(pos[0])}")
    return pos


def bitmap_of(positions: np.ndarray) -> BitMap:
    """A 32-bit Roaring bitmap of ``positions`` (sorted unique, each below 2^32), run containers where smaller."""
    bitmap = BitMap(array.array("I", np.asarray(positions).astype(np.uint32).tobytes()))
    bitmap.run_optimize()
    return bitmap


def serialize_bitmap(bitmap: BitMap) -> bytes:
    """A 32-bit Roaring bitmap (positions below 2^32) as the portable 64-bit Roaring bitmap of a deletion vector: one
    bitmap, key 0."""
    return struct.pack("<QI", 1, 0) + bitmap.serialize()


def serialize_positions(positions: Iterable[int] | np.ndarray) -> bytes:
    """The positions as a portable 64-bit Roaring bitmap (run containers where they are smaller)."""
    pos = _positions(positions)
    if len(pos) and pos[-1] < 1 << 32:  # every row of a file with fewer than 2^32 rows: one 32-bit bitmap, key 0
        return serialize_bitmap(bitmap_of(pos))
    keys = (pos >> 32).astype(np.uint32)
    bounds = np.flatnonzero(keys[1:] != keys[:-1]) + 1 if len(pos) else np.zeros(0, np.int64)
    starts = np.concatenate(([0], bounds)).astype(np.int64) if len(pos) else bounds
    ends = np.concatenate((bounds, [len(pos)])).astype(np.int64) if len(pos) else bounds
    parts = [struct.pack("<Q", len(starts))]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        low = (pos[s:e] & 0xFFFFFFFF).astype(np.uint32)
        bitmap = BitMap(array.array("I", low.tobytes()))
        bitmap.run_optimize()
        parts.append(struct.pack("<I", int(keys[s])))
        parts.append(bitmap.serialize())
    return b"".join(parts)


def deserialize_positions(data: bytes | memoryview) -> np.ndarray:
    """Sorted positions of a portable 64-bit Roaring bitmap (the whole of ``data``)."""
    view = memoryview(data)
    if len(view) < 8:
        raise PuffinFormatError(f"a 64-bit Roaring bitmap needs at least 8 bytes, got {len(view)}")
    (count,) = struct.unpack_from("<Q", view, 0)
    at = 8
    out = []
    last_key = -1
    for _ in range(count):
        if at + 4 > len(view):
            raise PuffinFormatError("the Roaring bitmap ends inside a key")
        (key,) = struct.unpack_from("<I", view, at)
        if key <= last_key:
            raise PuffinFormatError(f"the Roaring bitmap's keys are not ascending ({key} after {last_key})")
        last_key = key
        at += 4
        size = _portable_size(view, at)
        try:
            bitmap = BitMap.deserialize(bytes(view[at:at + size]))
        except (ValueError, RuntimeError) as exc:
            raise PuffinFormatError(f"a 32-bit Roaring bitmap does not decode: {exc}") from exc
        at += size
        low = np.frombuffer(bitmap.to_array(), dtype=np.uint32).astype(np.int64)
        out.append(low + (key << 32))
    if at != len(view):
        raise PuffinFormatError(f"{len(view) - at} bytes follow the Roaring bitmap")
    if not out:
        return _EMPTY.copy()
    return out[0] if len(out) == 1 else np.concatenate(out)


def _portable_size(view: memoryview, start: int) -> int:
    """Bytes taken by the 32-bit portable Roaring bitmap at ``start`` (the format of RoaringFormatSpec)."""
    def u16(at: int) -> int:
        return struct.unpack_from("<H", view, at)[0]

    try:
        at = start
        (cookie,) = struct.unpack_from("<I", view, at)
        at += 4
        if cookie & 0xFFFF == _COOKIE_RUNS:
            n = (cookie >> 16) + 1
            run_flags = bytes(view[at:at + (n + 7) // 8])
            at += (n + 7) // 8
        elif cookie == _COOKIE_NO_RUNS:
            (n,) = struct.unpack_from("<I", view, at)
            at += 4
            run_flags = b""
        else:
            raise PuffinFormatError(f"not a portable Roaring bitmap (cookie {cookie})")
        cards = [u16(at + 4 * i + 2) + 1 for i in range(n)]
        at += 4 * n
        if cookie == _COOKIE_NO_RUNS or n >= _NO_OFFSET_THRESHOLD:
            at += 4 * n
        for i, card in enumerate(cards):
            if run_flags and run_flags[i // 8] >> (i % 8) & 1:
                at += 2 + 4 * u16(at)
            elif card <= 4096:
                at += 2 * card
            else:
                at += 8192
    except struct.error as exc:
        raise PuffinFormatError("the Roaring bitmap is truncated") from exc
    if at > len(view):
        raise PuffinFormatError("the Roaring bitmap is truncated")
    return at - start


def encode_deletion_vector(positions: Iterable[int] | np.ndarray | BitMap) -> bytes:
    """A ``deletion-vector-v1`` blob deleting ``positions`` (non-negative row positions of one data file; or a 32-bit
    Roaring bitmap of them, serialized as it is: a writer that keeps a file's bitmap between commits adds to it)."""
    body = DV_MAGIC + (serialize_bitmap(positions) if isinstance(positions, BitMap) else serialize_positions(positions))
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


def decode_deletion_vector(blob: bytes | memoryview) -> np.ndarray:
    """Sorted positions of a ``deletion-vector-v1`` blob; :class:`PuffinFormatError` on a wrong length, magic or CRC."""
    view = memoryview(blob)
    if len(view) < 12:
        raise PuffinFormatError(f"a deletion vector blob has at least 12 bytes, got {len(view)}")
    (length,) = struct.unpack_from(">I", view, 0)
    if length != len(view) - 8:
        raise PuffinFormatError(f"the deletion vector's length field says {length} bytes, the blob holds {len(view) - 8}")
    body = view[4:4 + length]
    if bytes(body[:4]) != DV_MAGIC:
        raise PuffinFormatError(f"not a deletion vector: magic {bytes(body[:4]).hex()}, expected {DV_MAGIC.hex()}")
    (crc,) = struct.unpack_from(">I", view, 4 + length)
    if zlib.crc32(body) != crc:
        raise PuffinFormatError(f"the deletion vector's CRC-32 does not match (stored {crc:08x}, computed {zlib.crc32(body):08x})")
    out = deserialize_positions(body[4:])
    out.setflags(write=False)
    return out


# --- the file -------------------------------------------------------------------------------------------------


def puffin_bytes(vectors: Iterable[tuple[str, np.ndarray | BitMap]], created_by: str = CREATED_BY,
                 ) -> tuple[bytes, list[tuple[str, int, int, int]]]:
    """A Puffin file holding one deletion vector per ``(referenced data file, positions)``, and per blob
    ``(referenced data file, offset, length, cardinality)``. Positions may be given as a 32-bit Roaring bitmap.

    A data file may be named once: the spec allows one vector per data file.
    ``created_by`` is the footer's ``created-by`` property (the writer's name).
    """
    parts = [PUFFIN_MAGIC]
    at = len(PUFFIN_MAGIC)
    blobs: list[tuple[str, int, int, int]] = []
    meta = []
    seen: set[str] = set()
    for data_file, positions in vectors:
        if data_file in seen:
            raise InvalidArgumentError(f"two deletion vectors for one data file: {data_file}")
        seen.add(data_file)
        pos = positions if isinstance(positions, BitMap) else _positions(positions)
        blob = encode_deletion_vector(pos)
        parts.append(blob)
        blobs.append((data_file, at, len(blob), len(pos)))
        meta.append({
            "type": DV_BLOB_TYPE, "fields": [ROW_POSITION_FIELD_ID], "snapshot-id": -1, "sequence-number": -1,
            "offset": at, "length": len(blob),
            "properties": {"referenced-data-file": data_file, "cardinality": str(len(pos))},
        })
        at += len(blob)
    payload = json.dumps({"blobs": meta, "properties": {"created-by": created_by}}, separators=(",", ":")).encode()
    parts += [PUFFIN_MAGIC, payload, struct.pack("<i", len(payload)), bytes(4), PUFFIN_MAGIC]
    return b"".join(parts), blobs


def write_deletion_vectors(io: FileIO, path: str, vectors: Iterable[tuple[str, np.ndarray | BitMap]]) -> list[DeletionVectorBlob]:
    """Write a new Puffin file at ``path`` with one deletion vector per ``(referenced data file, positions)``.

    Returns, in the order given, what each blob's delete-file manifest entry
    records. ``referenced data file`` must be the data file's location exactly
    as the table's metadata names it.
    """
    data, blobs = puffin_bytes(vectors)
    size = fileio.write_bytes(io, path, data)
    return [DeletionVectorBlob(path, size, ref, off, length, card) for ref, off, length, card in blobs]


def read_deletion_vector(io: FileIO | None, path: str, offset: int, length: int) -> np.ndarray:
    """Sorted positions of the deletion vector stored at ``offset`` (``length`` bytes) in the Puffin file ``path``.

    One ranged read; the footer is not consulted (a manifest entry's
    ``content_offset`` and ``content_size_in_bytes`` locate the blob).
    """
    if offset < len(PUFFIN_MAGIC) or length < 12:
        raise PuffinFormatError(f"{path}: no deletion vector can be at offset {offset} with length {length}")
    data = fileio.read_range(io, path, offset, length)
    if len(data) != length:
        raise PuffinFormatError(f"{path}: the deletion vector at offset {offset} is cut off ({len(data)} of {length} bytes)")
    try:
        return decode_deletion_vector(data)
    except PuffinFormatError as exc:
        raise PuffinFormatError(f"{path} at offset {offset}: {exc}") from None


def parse_footer(data: bytes) -> tuple[list[PuffinBlobMetadata], dict[str, str]]:
    """The blobs and file properties of a whole Puffin file's bytes (uncompressed footers only)."""
    if len(data) < 2 * len(PUFFIN_MAGIC) + _FOOTER_TAIL or data[:4] != PUFFIN_MAGIC or data[-4:] != PUFFIN_MAGIC:
        raise PuffinFormatError("not a Puffin file (no PFA1 magic at both ends)")
    (size,) = struct.unpack_from("<i", data, len(data) - _FOOTER_TAIL)
    flags = data[-8]
    start = len(data) - _FOOTER_TAIL - size
    if size < 0 or start - 4 < 4 or data[start - 4:start] != PUFFIN_MAGIC:
        raise PuffinFormatError(f"the Puffin footer's size ({size}) does not fit the file")
    if flags & _COMPRESSED_FLAG:
        raise PuffinFormatError("the Puffin footer is compressed (LZ4), which this release does not read")
    try:
        doc = json.loads(data[start:start + size])
        blobs = [
            PuffinBlobMetadata(
                b["type"], tuple(b.get("fields", ())), int(b["snapshot-id"]), int(b["sequence-number"]),
                int(b["offset"]), int(b["length"]), b.get("compression-codec"), dict(b.get("properties", {})),
            )
            for b in doc["blobs"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise PuffinFormatError(f"the Puffin footer is not valid: {exc}") from exc
    return blobs, dict(doc.get("properties", {}))


def read_puffin_deletion_vectors(io: FileIO | None, path: str) -> dict[str, np.ndarray]:
    """Referenced data file -> positions, of every deletion vector in the Puffin file at ``path`` (reads it whole).

    Without ``io`` the file is read through :mod:`lineage.storage.files`.
    """
    if io is not None:
        data = fileio.read_bytes(io, path)
    else:
        with files.open_input(path) as f:
            data = f.read()
    blobs, _ = parse_footer(data)
    out = {}
    for b in blobs:
        if b.type != DV_BLOB_TYPE:
            continue
        ref = b.properties.get("referenced-data-file")
        if ref is None:
            raise PuffinFormatError(f"{path}: a deletion vector at offset {b.offset} names no referenced-data-file")
        positions = decode_deletion_vector(data[b.offset:b.offset + b.length])
        if str(len(positions)) != b.properties.get("cardinality", str(len(positions))):
            raise PuffinFormatError(f"{path}: the deletion vector of {ref} holds {len(positions)} positions, "
                                    f"its cardinality says {b.properties['cardinality']}")
        out[ref] = positions
    return out
