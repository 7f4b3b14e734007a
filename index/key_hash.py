"""A stable 64-bit hash of key values, the sort order of key index segments.

The hash is defined here in plain numpy arithmetic, not borrowed from a
library whose hash may change between releases: every fixed-width value
(booleans, integers of any width, dates, times, timestamps of any unit,
decimals) is read as its little-endian integer words and mixed with the
SplitMix64 finalizer; strings and binary values are hashed from their bytes
(a polynomial over the bytes modulo 2**64, plus the length, then mixed). A
multi-column key combines its columns in key order. The same value in the
same Arrow type hashes the same in every process, on every platform, in
every run; the name :data:`HASH_NAME` is written into each segment and a
segment carrying another name is treated as stale (rebuilt).

A hash is only an address: the index stores the full key beside it and
compares it on every lookup, so two keys with equal hashes never mix.
Tests narrow :data:`_MASK` to force collisions (the name then changes too).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from lineage.errors import InvalidArgumentError

HASH_NAME = "lineage-key-hash-1"

_FULL = np.uint64(0xFFFFFFFFFFFFFFFF)
_MASK = _FULL  # tests narrow this to force collisions
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_BYTE_BASE = np.uint64(0x100000001B3)
_CHUNK_BYTES = 1 << 22  # bytes hashed per step (bounds the temporaries to ~128 MiB)
_powers = np.ones(1, np.uint64)


def hash_name() -> str:
    """The name of the hash function in force (recorded in every segment)."""
    return HASH_NAME if _MASK == _FULL else f"{HASH_NAME}/mask={int(_MASK):x}"


def _mix(x: np.ndarray, *, inplace: bool = False) -> np.ndarray:
    """SplitMix64's finalizer: a bijection of uint64 that spreads every input bit.

    With ``inplace`` the result overwrites ``x``. One scratch array serves every shift (fresh
    temporaries per step cost more than the arithmetic on large key batches).
    """
    z = np.add(x, _GOLDEN, out=x if inplace else None)
    t = np.empty_like(z)
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        np.right_shift(z, np.uint64(shift), out=t)
        z ^= t
        if mult is not None:
            z *= mult
    return z


def _byte_powers(n: int) -> np.ndarray:
    """``_BYTE_BASE ** i`` modulo 2**64 for i < n (cached, grown on demand)."""
    global _powers
    if len(_powers) < n:
        grown = np.full(max(n, 2 * len(_powers)), _BYTE_BASE, np.uint64)
        grown[0] = 1
        _powers = np.cumprod(grown, dtype=np.uint64)
    return _powers


def _bytes_hash(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Hash of each variable-length value: sum of byte_i * base**i, mixed with the length."""
    n = len(offsets) - 1
    lengths = np.diff(offsets).astype(np.int64)
    out = np.zeros(n, np.uint64)
    start = 0
    while start < n:
        # Rows [start, stop) hold at most _CHUNK_BYTES bytes (or a single longer value).
        stop = int(np.searchsorted(offsets, offsets[start] + _CHUNK_BYTES, side="right")) - 1
        stop = min(n, max(stop, start + 1))
        lo, hi = int(offsets[start]), int(offsets[stop])
        lens = lengths[start:stop]
        nonempty = np.flatnonzero(lens)
        if hi > lo and len(nonempty):
            rel = (offsets[start:stop] - lo).astype(np.int64)
            within = np.arange(hi - lo, dtype=np.int64) - np.repeat(rel, lens)
            powers = _byte_powers(int(lens.max()))
            contrib = data[lo:hi].astype(np.uint64) * powers[within]
            out[start + nonempty] = np.add.reduceat(contrib, rel[nonempty])
        start = stop
    return _mix(out ^ _mix(lengths.astype(np.uint64)))


def _fixed_words(arr: pa.Array) -> np.ndarray:
    """The values of a fixed-width array as rows of little-endian uint64 words (sign-extended)."""
    width = arr.type.bit_width
    n = len(arr)
    buf = arr.buffers()[1]
    if width <= 64:
        signed = not (pa.types.is_unsigned_integer(arr.type))
        raw = np.frombuffer(buf, dtype=np.dtype(f"<{'i' if signed else 'u'}{width // 8}"), count=arr.offset + n)[arr.offset :]
        return raw.astype(np.int64).view(np.uint64).reshape(n, 1)
    words = width // 64
    raw = np.frombuffer(buf, dtype=np.dtype("<u8"), count=(arr.offset + n) * words)[arr.offset * words :]
    return raw.reshape(n, words)


def column_hash(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Hash of every value of one key column (no nulls allowed)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if isinstance(arr.type, pa.BaseExtensionType):
        arr = arr.storage
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if arr.null_count:
        raise InvalidArgumentError("key values may not be null")
    t = arr.type
    if pa.types.is_boolean(t):
        return _mix(arr.to_numpy(zero_copy_only=False).astype(np.uint64))
    if pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        data = np.frombuffer(arr.buffers()[1], np.uint8, count=(arr.offset + len(arr)) * width)[arr.offset * width :]
        return _bytes_hash(np.arange(len(arr) + 1, dtype=np.int64) * width, data)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offsets = np.frombuffer(arr.buffers()[1], np.int64 if large else np.int32, count=arr.offset + len(arr) + 1)[arr.offset :]
        data = np.frombuffer(arr.buffers()[2], np.uint8) if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
        return _bytes_hash(offsets.astype(np.int64), data)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return column_hash(arr.cast(pa.large_string() if pa.types.is_string_view(t) else pa.large_binary()))
    if t.bit_width and t.bit_width % 8 == 0 and (t.bit_width <= 64 or t.bit_width % 64 == 0):
        words = _fixed_words(arr)
        # Mixed in place: the first word is a private copy (_fixed_words widens one-word values with
        # astype; a column of several words is strided, so ascontiguousarray copies it), never Arrow's buffer.
        h = _mix(np.ascontiguousarray(words[:, 0]), inplace=True)
        for i in range(1, words.shape[1]):
            h ^= words[:, i]
            h = _mix(h, inplace=True)
        return h
    raise InvalidArgumentError(f"key columns of type {t} cannot be indexed")


def key_hash(keys: pa.Table) -> np.ndarray:
    """The 64-bit hash of every row of ``keys`` (its columns in key order)."""
    h = np.full(keys.num_rows, np.uint64(len(keys.column_names)), np.uint64)
    for j, name in enumerate(keys.column_names):
        h *= _M1
        h += column_hash(keys.column(name))
        h += np.uint64(j)
        h = _mix(h, inplace=True)
    h &= _MASK
    return h


def _inverse(m: np.uint64) -> np.uint64:
    return np.uint64(pow(int(m), -1, 1 << 64))


_M1_INV, _M2_INV = _inverse(_M1), _inverse(_M2)


def _unmix(z: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_mix` (each xor-shift and odd multiplication is undone in reverse order)."""
    z = z.copy()
    for shift, mult in ((31, _M2_INV), (27, _M1_INV), (30, None)):
        z ^= (z >> np.uint64(shift)) ^ (z >> np.uint64(2 * shift))
        if mult is not None:
            z *= mult
    z -= _GOLDEN
    return z


def _invertible_type(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t)
            or pa.types.is_duration(t)) and t.bit_width <= 64


def hash_is_injective(types: list[pa.DataType]) -> bool:
    """Whether :func:`key_hash` maps distinct keys of these types to distinct hashes.

    True for a single integer-like column of at most 64 bits (integers, dates, times, timestamps,
    durations) under the full hash: the value's sign-extended 64-bit word goes through bijections only
    (the finalizer, an odd multiplication, an addition). Such a key is recovered from its hash
    (:func:`unhash`), so a segment need not store it.
    """
    return _MASK == _FULL and len(types) == 1 and _invertible_type(types[0])


def unhash(hashes: np.ndarray, t: pa.DataType) -> pa.Array:
    """The key values whose :func:`key_hash` is ``hashes`` (a key for which :func:`hash_is_injective` holds)."""
    if not hash_is_injective([t]):
        raise InvalidArgumentError(f"keys of type {t} cannot be recovered from their hash")
    word = _unmix(np.asarray(hashes, np.uint64))
    word -= _M1  # key_hash: (1 * _M1 + column_hash + 0), mixed
    word = _unmix(word).view(np.int64)
    width = t.bit_width
    if pa.types.is_unsigned_integer(t):
        values = word.view(np.uint64).astype(np.dtype(f"<u{width // 8}"))
    else:
        values = word.astype(np.dtype(f"<i{width // 8}"))
    return pa.Array.from_buffers(t, len(values), [None, pa.py_buffer(np.ascontiguousarray(values))])
