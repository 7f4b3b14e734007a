"""The lineage segments the next list names: the survivors of a commit, its new segment, merged on commit.

A segment describes the data files one commit added, so without merging a
list names one more segment per commit and planning reads them all. Segments
are merged like Iceberg manifests (:mod:`lineage.commits.merge_rule`, properties
``lineage.segment*``): the new segment is the "first" item, the others follow
newest first, and a merged segment holds the lineage of the bin's files that
are still live (files removed since are dropped). Merged segments are new
immutable files; the ones they replace stay readable for older snapshots
until vacuum removes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyiceberg.manifest import DataFile

from lineage.commits.merge_rule import MergeSettings, plan_merge
from lineage.storage.metadata import FileLineage, read_segment, write_segment
from lineage.state import TableState


@dataclass(frozen=True)
class NextSegments:
    """What the next lineage list names, and what merging wrote."""

    segments: tuple[str, ...]  # oldest first
    sizes: dict[str, int]
    bytes_written: int = 0
    moved: dict[str, str] = field(default_factory=dict)  # merged-away segment -> the merged segment


def next_segments(
    state: TableState,
    removed_data: list[DataFile],
    new_segment: str | None,
    new_size: int,
    new_files: list[FileLineage],
    path_of: Callable[[int], str],
    created: list[str],
) -> NextSegments:
    """Segments of the list after a commit that removes ``removed_data`` and adds ``new_segment``.

    ``path_of(i)`` names the i-th merged segment; every path written is
    appended to ``created`` first.
    """
    io = state.iceberg.io
    sizes = dict(state.lineage.segment_bytes)
    gone = {f.file_path for f in removed_data}
    live: set[str] | None = None

    def live_paths() -> set[str]:
        nonlocal live
        if live is None:
            live = (state.all_data_file_paths() - gone) | {f.file_path for f in new_files}
        return live

    segments = list(state.lineage.segments)
    if gone:
        known = state.files_if_known()
        if known is not None:
            alive = {s for p, s in known.segment_of.items() if p not in gone}
            segments = [s for s in segments if s in alive]
        else:
            segments = [s for s in segments if any(fl.file_path in live_paths() for fl in read_segment(io, s))]
    if new_segment is not None:
        segments.append(new_segment)
        sizes[new_segment] = new_size
    newest_first = list(reversed(segments))
    settings = MergeSettings.for_segments(state.iceberg.metadata.properties)
    out: list[str] = []
    moved: dict[str, str] = {}
    written = merged = 0
    for members, merge in plan_merge(newest_first, lambda s: sizes.get(s, 0), settings):
        if not merge:
            out.extend(members)
            continue
        files = [fl for s in reversed(members) for fl in read_segment(io, s) if fl.file_path in live_paths()]
        if not files:
            continue
        path = path_of(merged)
        merged += 1
        created.append(path)
        size = write_segment(io, path, files)
        written += size
        sizes[path] = size
        out.append(path)
        moved.update({s: path for s in members})
    kept = tuple(reversed(out))
    return NextSegments(kept, {s: sizes.get(s, 0) for s in kept}, written, moved)
