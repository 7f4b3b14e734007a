"""A pyiceberg catalog wrapper that injects faults at the catalog boundary (for tests).

It behaves like a networked catalog that can fail (a database behind a load
balancer, a REST service): ``commit_table`` and ``load_table`` raise
``sqlalchemy.exc.OperationalError`` on a schedule, before delegating (the
call never reached the catalog) or after (the commit landed but its reply
was lost). Tables loaded through it keep it as their catalog, so a table's
``refresh()`` goes through the faults too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table as IcebergTable
from sqlalchemy.exc import OperationalError

BEFORE, AFTER = "before", "after"
LATE = "late"  # commit_table raises without committing; the request lands just before the next commit_table call


def catalog_error(what: str) -> OperationalError:
    """The error a lost database connection gives."""
    return OperationalError(f"injected fault in {what}", None, Exception("server closed the connection unexpectedly"))


@dataclass
class Fault:
    """Raise in ``method`` (``commit_table`` or ``load_table``) ``when`` (before or after delegating).

    ``times`` calls fail (None: every call from then on), starting with the
    ``skip + 1``-th call made once ``after_commits`` commits were delegated
    (``after_commits=1``: the refresh right after the first commit).
    """

    method: str
    when: str = BEFORE
    times: int | None = 1
    skip: int = 0
    after_commits: int = 0
    error: Callable[[str], Exception] | None = None  # what to raise (default: a lost-connection OperationalError)
    calls: int = 0
    fired: int = 0

    def hit(self, commits: int) -> bool:
        if commits < self.after_commits:
            return False
        self.calls += 1
        if self.calls <= self.skip or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True


@dataclass
class FaultPlan:
    """Faults armed on a :class:`FaultyCatalog`, checked in order at each call."""

    faults: list[Fault] = field(default_factory=list)
    log: list[str] = field(default_factory=list)  # "commit_table:before" ... for every call, and "!..." for each fault raised
    commits: int = 0  # commits delegated to the wrapped catalog
    delayed: list[tuple[Any, Any, Any]] = field(default_factory=list)  # commit requests held back by a LATE fault
    on_commit: Callable[[], None] | None = None  # called just before a commit is delegated (e.g. to arm a later fault)


class FaultyCatalog(Catalog):
    """Delegates everything to ``inner``; ``commit_table`` and ``load_table`` obey ``plan``."""

    def __init__(self, inner: Catalog, plan: FaultPlan | None = None) -> None:  # noqa: D107 - no Catalog.__init__: nothing is configured here
        self.inner = inner
        self.name = inner.name
        self.properties = inner.properties
        self.plan = plan or FaultPlan()

    def arm(self, *faults: Fault) -> FaultyCatalog:
        """Replace the armed faults."""
        self.plan.faults = list(faults)
        return self

    def heal(self) -> FaultyCatalog:
        """Disarm every fault."""
        self.plan.faults = []
        return self

    def _check(self, method: str, when: str) -> None:
        self.plan.log.append(f"{method}:{when}")
        for f in self.plan.faults:
            if f.method == method and f.when == when and f.hit(self.plan.commits):
                self.plan.log.append(f"!{method}:{when}")
                raise (f.error or catalog_error)(f"{method} ({when})")

    def _wrap(self, table: IcebergTable) -> IcebergTable:
        return IcebergTable(table._identifier, table.metadata, table.metadata_location, table.io, self, table.config)

    def load_table(self, identifier: Any) -> IcebergTable:  # noqa: D102
        self._check("load_table", BEFORE)
        table = self.inner.load_table(identifier)
        self._check("load_table", AFTER)
        return self._wrap(table)

    def commit_table(self, table: IcebergTable, requirements: Any, updates: Any) -> Any:  # noqa: D102
        while self.plan.delayed:  # a request held back "in the network" reaches the catalog first
            held = self.plan.delayed.pop(0)
            self.plan.commits += 1
            try:
                self.inner.commit_table(*held)
                self.plan.log.append("commit_table:late-landed")
            except Exception as exc:  # noqa: BLE001 - its sender no longer waits for the answer
                self.plan.log.append(f"commit_table:late-refused:{type(exc).__name__}")
        try:
            self._check("commit_table", LATE)
        except Exception:
            self.plan.delayed.append((table, requirements, updates))
            raise
        self._check("commit_table", BEFORE)
        if self.plan.on_commit is not None:
            self.plan.on_commit()
        self.plan.commits += 1
        response = self.inner.commit_table(table, requirements, updates)
        self._check("commit_table", AFTER)
        return response

    def create_table(self, *args: Any, **kwargs: Any) -> IcebergTable:  # noqa: D102
        return self._wrap(self.inner.create_table(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: FaultyCatalog, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = name
    return method


# Every other abstract method of Catalog goes straight to the wrapped catalog.
for _name in Catalog.__abstractmethods__:
    if _name not in FaultyCatalog.__dict__:
        setattr(FaultyCatalog, _name, _delegate(_name))
FaultyCatalog.__abstractmethods__ = frozenset()


class ListingFaultCatalog(SqlCatalog):
    """pyiceberg's SqlCatalog whose listings fail for chosen namespaces (``--catalog py-catalog-impl=catalog_faults.ListingFaultCatalog``).

    Catalog properties ``fail-list-tables`` and ``fail-list-namespaces`` name a namespace (``a.b``) whose
    ``list_tables`` / ``list_namespaces`` raise the error a lost database connection gives.
    """

    def _fails(self, key: str, namespace: Any) -> bool:
        wanted = self.properties.get(key)
        name = namespace if isinstance(namespace, str) else ".".join(namespace)
        return bool(wanted) and name == wanted

    def list_tables(self, namespace: Any) -> Any:  # noqa: D102
        if self._fails("fail-list-tables", namespace):
            raise catalog_error(f"list_tables({namespace})")
        return super().list_tables(namespace)

    def list_namespaces(self, namespace: Any = ()) -> Any:  # noqa: D102
        if namespace and self._fails("fail-list-namespaces", namespace):
            raise catalog_error(f"list_namespaces({namespace})")
        return super().list_namespaces(namespace)
