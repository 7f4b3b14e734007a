"""What a Spark write's tasks wrote, findable by the driver when the job fails, so that nothing is left for vacuum.

Every file the tasks of a delete, update or upsert on Spark write is either
named under the job's prefix (``<index dir>/<version>-<uuid>``: scratch
files, removed keys, the index segment) or recorded, right after it is
written, in a small ledger file under that prefix (:class:`Ledger`: data
files, delete files and deletion vectors, which are named where the table
keeps them). When a Spark job of the write fails, the commit is not made and
the driver deletes them all (:func:`discard`): the files under the prefix,
and every file a ledger names. On success the job's last task deletes the
scratch files and the ledgers, and the commit takes the rest.

A task that dies between writing a file and recording it leaves that one
file (a window of one write); files of a task attempt that failed while the
job succeeded (Spark ran the task again) are left for vacuum too.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import lineage.storage.files as store
from lineage.storage.fileio import write_bytes

LEDGER = "-wrote.json"  # the suffix of a ledger file

log = logging.getLogger(__name__)


@dataclass
class Ledger:
    """The ledger files of one task under ``prefix``: :meth:`wrote` records files as they are written."""

    io: Any
    prefix: str
    paths: list[str] = field(default_factory=list)

    def wrote(self, files: list[str]) -> None:
        """Record ``files`` (just written) in a ledger file of their own."""
        if not files:
            return
        path = f"{self.prefix}-{uuid.uuid4()}{LEDGER}"
        write_bytes(self.io, path, json.dumps(files).encode())
        self.paths.append(path)


def discard(io: Any, prefix: str) -> list[str]:
    """Delete every file under ``prefix`` and every file its ledgers name (a failed job's files); the paths deleted.

    A failure to clean is logged, not raised: the caller is already raising the job's own error.
    """
    try:
        root = prefix.rsplit("/", 1)[0]
        found = [f.location for f in store.list_files(root) if f.location.startswith(prefix)]
        named: list[str] = []
        for loc in found:
            if loc.endswith(LEDGER):
                with io.new_input(loc).open() as f:
                    named.extend(json.loads(f.read()))
        gone = named + found
        store.delete_many(gone)
        return gone
    except Exception:  # noqa: BLE001 - the job's error is the one to raise
        log.warning("could not delete the files of a failed Spark job under %s; vacuum removes them", prefix, exc_info=True)
        return []
