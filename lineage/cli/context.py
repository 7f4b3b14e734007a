"""What every ``lineage`` command shares: the :class:`Context`, catalog resolution, CLI errors, exit codes.

Command modules (``tables``, ``reads``, ``writes``, ``maintenance``, ``mv``)
import this module; it imports none of them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from lineage.cli.format import Output, Progress
from lineage.cli.option_values import parse_pairs
from lineage.errors import InvalidArgumentError, LineageError, TableNotFoundError
from lineage.storage.files import is_remote

PROG = "lineage"
DEFAULT_WAREHOUSE = "warehouse"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

log = logging.getLogger("lineage.cli")


class VerifyFailed(LineageError):
    """``lineage verify`` found inconsistencies (exit code 1)."""


class CatalogUnavailableError(LineageError):
    """The catalog named by --catalog/--catalog-uri could not be opened (exit code 1)."""


@dataclass(frozen=True)
class Skipped:
    """A table or view a command left out (or showed only in part), and why."""

    subject: str  # "table shop.orders", "view shop.totals", "namespace shop"
    reason: str
    error: bool  # True: a failure (exit code 1); False: nothing went wrong (e.g. not a lineage table)


@dataclass
class Context:
    """What every command gets: its arguments, the output, the progress bars and the catalog."""

    args: argparse.Namespace
    out: Output
    progress: Progress
    _catalog: Any = field(default=None, repr=False)
    skipped: list[Skipped] = field(default_factory=list)
    _reported: int = 0

    @property
    def quiet(self) -> bool:
        return bool(self.args.quiet)

    def note(self, text: str) -> None:
        """A human remark on stderr (suppressed by --quiet)."""
        if not self.quiet:
            print(text, file=sys.stderr)

    def skip(self, subject: str, reason: str, *, error: bool = True) -> None:
        """Record that ``subject`` was left out of the command's work or listing (or shown in part), and why.

        :meth:`finish` reports it as ``lineage: [error: ]SUBJECT: REASON``.
        """
        self.skipped.append(Skipped(subject, first_line(reason), error))
        log.debug("skipped %s: %s", subject, reason)

    def finish(self, code: int) -> int:
        """Report what was skipped on stderr, once; the exit code: ``code``, or 1 if anything was skipped for an error.

        Errors are reported also with --quiet (one ``lineage: error:`` line each); other skips are notes.
        """
        for s in self.skipped[self._reported:]:
            if s.error:
                print(f"{PROG}: error: {s.subject}: {s.reason}", file=sys.stderr)
            else:
                self.note(f"{PROG}: {s.subject}: {s.reason}")
        self._reported = len(self.skipped)
        return EXIT_FAILURE if code == EXIT_OK and any(s.error for s in self.skipped) else code

    def catalog(self, create: bool = False) -> Any:
        """The catalog from --catalog/--catalog-uri, or the embedded one in --warehouse."""
        if self._catalog is None:
            self._catalog = resolve_cli_catalog(self.args, create)
        return self._catalog

    def open(self, name: str) -> Any:
        import lineage

        return lineage.open_table(name, catalog=self.catalog())


def warehouse_path(args: argparse.Namespace) -> str:
    return args.warehouse or os.environ.get("LINEAGE_WAREHOUSE") or DEFAULT_WAREHOUSE


def resolve_cli_catalog(args: argparse.Namespace, create: bool) -> Any:
    """``--catalog NAME|KEY=VALUE``/``--catalog-uri`` -> pyiceberg ``load_catalog``; else the warehouse's SQLite catalog."""
    from lineage.catalog import CATALOG_FILE, default_catalog

    entries = list(args.catalog or [])
    names = [e for e in entries if "=" not in e]
    props = parse_pairs([e for e in entries if "=" in e], "--catalog")
    if args.catalog_uri:
        props["uri"] = args.catalog_uri
    warehouse = warehouse_path(args)
    if not names and not props:
        if is_remote(warehouse):
            raise InvalidArgumentError(f"a warehouse on an object store ({warehouse}) needs a catalog: pass --catalog-uri "
                                       "(postgresql+psycopg2://..., sqlite:///...) or --catalog")
        if not create and not os.path.exists(os.path.join(warehouse, CATALOG_FILE)):
            raise TableNotFoundError(
                f"no warehouse at {os.path.abspath(warehouse)} (it has no {CATALOG_FILE}); "
                "pass --warehouse PATH, set LINEAGE_WAREHOUSE, or create a table first"
            )
        return default_catalog(warehouse)
    if len(names) > 1:
        raise InvalidArgumentError(f"--catalog names more than one catalog: {names}")
    from pyiceberg.catalog import infer_catalog_type, load_catalog

    name = names[0] if names else "lineage"
    try:
        kind = props.get("type") or (str(infer_catalog_type(name, props).value) if props.get("uri") else None)
    except Exception:  # pyiceberg raises ValueError for a URI scheme it cannot place
        kind = None
    if (kind or "").lower() == "sql" and "warehouse" not in props:
        if is_remote(warehouse):  # s3://bucket/prefix: the store's settings come from --catalog s3.*=... or AWS_*
            props["warehouse"] = warehouse
        else:
            path = os.path.abspath(warehouse)
            os.makedirs(path, exist_ok=True)
            props["warehouse"] = path
    try:
        return load_catalog(name, **props)
    except ValueError as exc:
        raise InvalidArgumentError(f"--catalog: {str(exc).replace('using --uri', 'using --catalog-uri')}") from None
    except Exception as exc:  # unreachable server, unopenable database, bad credentials...
        raise CatalogUnavailableError(f"cannot open the catalog {name!r}: {type(exc).__name__}: {first_line(exc)}") from exc


def first_line(text: object) -> str:
    """The first non-empty line of a message (DuckDB appends multi-line context)."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0].rstrip() if lines else str(text)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"


def iter_tables(ctx: Context, namespace: str | None):  # type: ignore[no-untyped-def]
    """(identifier, pyiceberg table) of every table in the catalog (or one namespace), with a progress bar.

    A namespace whose sub-namespaces or tables cannot be listed, and a table that cannot be loaded, is
    skipped with :meth:`Context.skip` (an error: the command then exits 1), never in silence.
    """
    from pyiceberg.exceptions import NoSuchNamespaceError

    cat = ctx.catalog()
    if namespace:
        namespaces = [tuple(namespace.split("."))]
    else:
        namespaces, todo = [], list(cat.list_namespaces())
        while todo:
            ns = todo.pop(0)
            namespaces.append(ns)
            try:
                todo.extend(n for n in cat.list_namespaces(ns) if n != ns and n not in namespaces)
            except Exception as exc:
                ctx.skip(f"namespace {'.'.join(ns)}", f"skipped: its sub-namespaces could not be listed ({_why(exc)})")
    idents = []
    for ns in sorted(set(namespaces)):
        try:
            idents.extend(cat.list_tables(ns))
        except NoSuchNamespaceError:
            if namespace:
                raise TableNotFoundError(f"namespace {namespace} does not exist in this catalog") from None
            ctx.skip(f"namespace {'.'.join(ns)}", "skipped: it no longer exists", error=False)
        except Exception as exc:
            if namespace:
                raise CatalogUnavailableError(f"the tables of namespace {namespace} could not be listed ({_why(exc)})") from None
            ctx.skip(f"namespace {'.'.join(ns)}", f"skipped: its tables could not be listed ({_why(exc)})")
    with ctx.progress.task("loading tables", total=len(idents)) as task:
        for ident in sorted(idents):
            try:
                ice = cat.load_table(ident)
            except Exception as exc:
                ctx.skip(f"table {'.'.join(ident)}", f"skipped: it could not be loaded ({_why(exc)})")
                task.advance()
                continue
            task.advance()
            yield tuple(ident), ice
