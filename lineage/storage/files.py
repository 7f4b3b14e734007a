"""Files on the local file system or an object store, through pyarrow's file systems.

A table's files are named by URIs (``s3://bucket/key``) or local paths. The
settings of each bucket are registered once (:func:`register`, from the
catalog's properties when a table is opened) and every reader of this
process (and Spark's Python workers, which get :func:`registered`) finds
them by the bucket's name; a bucket nobody registered uses the AWS
environment and profile. Nothing here renames a file or relies on the
order of a listing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import lineage.storage.s3_get as s3_get
from lineage.errors import InvalidArgumentError
import lineage.storage.s3_reader as s3_reader
from lineage.storage.settings import StoreSettings, resolve

REMOTE_SCHEMES = ("s3", "s3a", "s3n")
_LOCK = threading.Lock()
_BUCKETS: dict[str, StoreSettings] = {}
_SYSTEMS: dict[StoreSettings, pafs.FileSystem] = {}
_generation = 0


def is_remote(location: str) -> bool:
    """Whether ``location`` names an object in an object store (``s3://``), not a local file."""
    return isinstance(location, str) and location.split("://", 1)[0].lower() in REMOTE_SCHEMES and "://" in location


def local_path(location: str) -> str:
    """A ``file:`` URI or plain path as a local path (object-store URIs are returned unchanged)."""
    if location.startswith("file:"):
        return urlparse(location).path
    return location


def bucket_of(location: str) -> str:
    """The bucket an ``s3://bucket/key`` URI names."""
    bucket = urlparse(location).netloc
    if not bucket:
        raise InvalidArgumentError(f"{location!r} names no bucket (expected s3://bucket/path)")
    return bucket


def register(location: str, properties: Mapping[str, str] | None = None) -> StoreSettings | None:
    """Remember how to reach the bucket of ``location`` (a table's or warehouse's location); None for a local one.

    ``properties`` are a catalog's or FileIO's (``s3.*`` names); what they
    leave out comes from the AWS environment and profile.
    """
    if not is_remote(location):
        return None
    settings = resolve(properties)
    register_settings({bucket_of(location): settings})
    return settings


def register_settings(buckets: Mapping[str, StoreSettings]) -> None:
    """Remember the settings of several buckets at once (what :func:`registered` returned in another process)."""
    global _generation
    with _LOCK:
        for bucket, settings in buckets.items():
            if _BUCKETS.get(bucket) != settings:
                _BUCKETS[bucket] = settings
                _generation += 1


def registered() -> dict[str, StoreSettings]:
    """The buckets this process knows, with their settings."""
    with _LOCK:
        return dict(_BUCKETS)


def generation() -> int:
    """A number that changes whenever a bucket's settings change (DuckDB databases re-create their secrets)."""
    return _generation


def settings_for(location: str) -> StoreSettings:
    """The settings of the bucket of ``location``: registered, or from the AWS environment and profile."""
    with _LOCK:
        known = _BUCKETS.get(bucket_of(location))
    return known if known is not None else resolve()


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system holding ``location`` and the path of ``location`` inside it."""
    if not is_remote(location):
        return pafs.LocalFileSystem(), local_path(location)
    settings = settings_for(location)
    with _LOCK:
        fs = _SYSTEMS.get(settings)
        if fs is None:
            fs = _SYSTEMS[settings] = _s3(settings)
    parsed = urlparse(location)
    return fs, f"{parsed.netloc}{parsed.path}"


def _s3(settings: StoreSettings) -> pafs.FileSystem:
    # allow_delayed_open: a small file is one PutObject, not a multipart upload (three requests)
    kwargs: dict[str, object] = {"region": settings.region, "force_virtual_addressing": settings.virtual_addressing,
                                 "allow_delayed_open": True}
    if settings.endpoint is not None:
        kwargs["endpoint_override"] = settings.host
        kwargs["scheme"] = settings.scheme
    if settings.access_key_id:
        kwargs.update(access_key=settings.access_key_id, secret_key=settings.secret_access_key)
        if settings.session_token:
            kwargs["session_token"] = settings.session_token
    return pafs.S3FileSystem(**kwargs)


def open_input(location: str) -> object:
    """A random-access reader of the file at ``location`` (a pyarrow ``NativeFile``).

    On an object store the reader asks no HEAD: opening reads the object's
    tail (a Parquet footer; all of a small file) in one GET, and any other
    range is one GET (:class:`lineage.storage.s3_reader.ObjectReader`).
    ``FileNotFoundError`` when there is no such file.
    """
    if is_remote(location):
        reader = s3_reader.ObjectReader(location, settings_for(location))
        reader.size()
        return pa.PythonFile(reader, mode="r")
    fs, path = filesystem(location)
    return fs.open_input_file(path)


def warm(locations: Sequence[str]) -> None:
    """Fetch the footers (all of a small file) of the object-store files among ``locations`` at once, before a reader
    opens them one after another (:func:`lineage.storage.s3_reader.warm`); nothing for local files."""
    s3_reader.warm([loc for loc in locations if is_remote(loc)], settings_for)


def read_range(location: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of the file at ``location`` (fewer at its end): on an object store one ranged GET.

    pyarrow would send a HEAD request first (to learn the size), so an object
    is read with one signed GET (:func:`lineage.storage.s3_get.get_range`).
    """
    if not is_remote(location):
        with open(local_path(location), "rb") as f:
            f.seek(offset)
            return f.read(length)
    if length <= 0:
        return b""
    return s3_get.get_range(location, settings_for(location), f"{offset}-{offset + length - 1}")[0]


def parquet_file(location: str) -> pq.ParquetFile:
    """The Parquet file at ``location`` (only its footer is read now; column chunks are read by byte range)."""
    if not is_remote(location):
        return pq.ParquetFile(local_path(location))
    return pq.ParquetFile(open_input(location))


@dataclass(frozen=True)
class FileInfo:
    """A listed file: its location (as the table names it), size and modification time."""

    location: str
    size: int
    mtime_ns: int


def info(location: str) -> FileInfo:
    """Size and modification time of the file at ``location`` (``FileNotFoundError`` when it is missing)."""
    if not is_remote(location):
        st = os.stat(local_path(location))
        return FileInfo(location, st.st_size, st.st_mtime_ns)
    fs, path = filesystem(location)
    got = fs.get_file_info(path)
    if got.type != pafs.FileType.File:
        raise FileNotFoundError(location)
    return FileInfo(location, int(got.size or 0), int(got.mtime_ns or 0))


def exists(location: str) -> bool:
    """Whether a file is at ``location``."""
    try:
        info(location)
    except FileNotFoundError:
        return False
    return True


def delete(location: str) -> None:
    """Delete the file at ``location`` (a missing file is not an error)."""
    if not is_remote(location):
        try:
            os.remove(local_path(location))
        except FileNotFoundError:
            pass
        return
    s3_reader.discard(location)  # a deleted object is not served from memory either
    # one request (pyarrow's delete_file sends a HEAD first and may PUT a folder marker after)
    s3_get.delete(location, settings_for(location))


def list_files(root: str) -> list[FileInfo]:
    """Every file under the folder (or key prefix) ``root``, named as ``root`` names them, sorted by name.

    An object store's listing order is not relied on: the result is sorted here.
    """
    fs, path = filesystem(root)
    if not is_remote(root) and not os.path.isdir(path):
        return []
    selector = pafs.FileSelector(path.rstrip("/"), recursive=True, allow_not_found=True)
    out = []
    prefix = root.rstrip("/")
    base = path.rstrip("/")
    for got in fs.get_file_info(selector):
        if got.type != pafs.FileType.File:
            continue
        out.append(FileInfo(prefix + got.path[len(base):], int(got.size or 0), int(got.mtime_ns or 0)))
    out.sort(key=lambda f: f.location)
    return out


PARALLEL_REQUESTS = 16  # independent object-store requests in flight at once (each one costs a round trip)


def delete_many(locations: list[str]) -> None:
    """Delete the files at ``locations`` (missing ones are not an error).

    An object store's go by ``DeleteObjects`` requests (up to 1000 objects of
    a bucket each) in parallel; a store that refuses one (Google Cloud
    Storage's XML API), or objects it could not remove, get one
    ``DeleteObject`` each, whose error is raised.
    """
    by_bucket: dict[str, list[str]] = {}
    for loc in locations:
        if is_remote(loc):
            by_bucket.setdefault(bucket_of(loc), []).append(loc)
        else:
            delete(loc)
    batches = [group[i:i + 1000] for group in by_bucket.values() for i in range(0, len(group), 1000)]
    if batches:
        with ThreadPoolExecutor(min(PARALLEL_REQUESTS, len(batches))) as pool:
            left = [loc for rest in pool.map(delete_batch, batches) for loc in rest]
        if left:
            with ThreadPoolExecutor(min(PARALLEL_REQUESTS, len(left))) as pool:
                list(pool.map(delete, left))


def delete_batch(batch: list[str]) -> list[str]:
    """Remove ``batch`` (up to 1000 objects of one bucket) with one request; the locations still to remove one by one
    (all of them when the store refuses the request)."""
    for location in batch:
        s3_reader.discard(location)
    try:
        return s3_get.delete_objects(batch, settings_for(batch[0]))
    except OSError:
        return batch


def source(location: str) -> object:
    """What pyarrow's Parquet readers take for ``location``: a local path, or an object store's random-access reader."""
    return open_input(location) if is_remote(location) else local_path(location)
