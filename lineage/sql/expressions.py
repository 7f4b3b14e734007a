"""User-supplied SQL expressions: parsed by DuckDB, checked against the allow-list, re-rendered.

Every SQL text a caller hands the library (a ``where`` of scan, delete,
update and purge, the values of an update's ``set``, the clauses of a
materialized view) goes through :func:`check` before DuckDB runs anything:

1. DuckDB's own parser reads ``SELECT <text>`` into its parse tree
   (``json_serialize_sql``, which parses and never executes). The statement
   must have exactly the shape of ``SELECT 1``: one select item and nothing
   else, so a parenthesis or a ``;`` that breaks out of the expression, a
   ``FROM``, a second item or a second statement is refused.
2. Comments are refused (they can only hide text from the person reading
   the predicate).
3. Every column reference is bound to one of the allowed columns (table
   and lineage columns); ``s.f`` on a struct column becomes ``s['f']``.
4. Every node of the tree must be on the allow-list of
   :mod:`lineage.sql.allowlist`: literals, columns, operators, CASE, CAST, and
   deterministic scalar functions. Subqueries, table functions, aggregates,
   window functions, lambdas and functions that read the environment are
   refused by name.
5. The checked tree is rendered back to SQL by DuckDB
   (``json_deserialize_sql``), in parentheses. That text, never the
   caller's, is what runs, and it is parsed and checked once more exactly as
   it will be pasted into a statement, so what DuckDB executes is what was
   checked.

DuckDB's parser rather than sqlglot: the tree checked is DuckDB's own tree
for the text, so no dialect difference between the checking parser and the
executing engine can open a gap.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import lineage.sql.allowlist as allowlist

import lineage.duck as duck
from lineage.errors import BadPredicateError, UnknownColumnError

MAX_LENGTH = 1_000_000  # characters (an IN list of 100,000 keys fits); longer text is refused before it is parsed


@dataclass(frozen=True)
class Checked:
    """An expression that passed every check."""

    sql: str  # DuckDB SQL rendered from the checked parse tree, in parentheses (a bare column: its quoted name): the only text that runs
    columns: tuple[str, ...]  # the columns it reads, in order of first use
    tree: str  # JSON of DuckDB's parse tree of ``sql`` (without source positions): what derived checks read


def check(text: object, columns: Sequence[str], what: str = "where") -> Checked:
    """Parse ``text`` as one scalar expression over ``columns`` and return it re-rendered.

    ``what`` names the argument in error messages (``where``, ``set['amount']``).
    Raises :class:`BadPredicateError` naming what was refused, and
    :class:`UnknownColumnError` for a column that is not in ``columns``.
    """
    if not isinstance(text, str):
        raise BadPredicateError(f"{what} must be a SQL string, got {type(text).__name__}")
    if not text.strip():
        raise BadPredicateError(f"{what} is an empty string")
    if "\x00" in text:  # DuckDB's parser stops at a NUL: the rest would be dropped without a word
        raise BadPredicateError(f"{what} {text!r} is refused: it contains a NUL character")
    if len(text) > MAX_LENGTH:
        raise BadPredicateError(f"{what} is {len(text):,} characters long; an expression may have at most {MAX_LENGTH:,}")
    return _check(text, tuple(columns), what)


@lru_cache(maxsize=1024)
def _check(text: str, columns: tuple[str, ...], what: str) -> Checked:
    label = f"{what} {text!r}"
    tree = _parse(f"SELECT {text}", label)
    item = _select_item(tree, label)
    if _has_comment(text):
        raise BadPredicateError(f"{label} is refused: it contains a comment; write the expression without -- or /* */")
    walker = _Walker(columns, label, rewrite=True)
    item = walker.visit(item, None)
    if item.get("class") == "COLUMN_REF":  # a bare column: its quoted name, which callers recognise as a plain column
        rendered = '"' + walker.used[0].replace('"', '""') + '"'
    else:
        rendered = "(" + _render(tree, item, label) + ")"
    # The text that runs, parsed and checked as it will be pasted: nothing may need binding or rewriting any more.
    final = _Walker(columns, label, rewrite=False)
    checked = _select_item(_parse(f"SELECT {rendered}", label), label)
    final.visit(checked, None)
    return Checked(rendered, tuple(walker.used), json.dumps(_strip(checked)))


@lru_cache(maxsize=256)
def check_type(text: str) -> str:
    """DuckDB's own spelling of the type name ``text``; BadPredicateError if ``text`` is anything but one type name.

    For type names that are pasted into SQL from stored metadata (a view's column types).
    """
    label = f"the type {text!r}"
    if not isinstance(text, str) or "\x00" in text:
        raise BadPredicateError(f"{label} is not a type name")
    tree = _parse(f"SELECT CAST(NULL AS {text})", label)
    item = _select_item(tree, label)
    child = item.get("child") or {}
    if item.get("class") != "CAST" or item.get("try_cast") or child.get("class") != "CONSTANT" or not (child.get("value") or {}).get("is_null"):
        raise BadPredicateError(f"{label} is not a type name")
    rendered = _render(tree, item, label)
    prefix, suffix = "CAST(NULL AS ", ")"
    if not (rendered.startswith(prefix) and rendered.endswith(suffix)):
        raise BadPredicateError(f"{label} could not be rendered back to SQL (got {rendered!r})")
    return rendered[len(prefix):-len(suffix)]


# ---------------------------------------------------------------- parsing and rendering


def _parse(sql: str, label: str) -> dict[str, Any]:
    with duck.scratch() as con:
        import duckdb  # loaded: the connection is open

        try:
            raw = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]  # type: ignore[index]
        except duckdb.Error as exc:
            raise BadPredicateError(f"{label} is not a valid SQL expression: {exc}") from None
    try:
        tree = json.loads(raw)
    except RecursionError:
        raise BadPredicateError(f"{label} is nested too deeply") from None
    if tree.get("error"):
        message = str(tree.get("error_message", "unknown error"))
        if "Only SELECT" in message or "statement" in message.lower():
            raise BadPredicateError(f"{label} is not a single expression (it holds another statement): {message}")
        raise BadPredicateError(f"{label} is not a valid SQL expression: {message}")
    return tree


def _strip(node: Any) -> Any:
    """``node`` without source positions (which differ between otherwise equal trees)."""
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "query_location"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


@lru_cache(maxsize=1)
def _bare_select() -> str:
    """The statement around the select item of ``SELECT 1``: what every parsed expression must sit in."""
    tree = _parse("SELECT 1", "the template")
    statement = tree["statements"][0]
    node = {k: v for k, v in statement["node"].items() if k != "select_list"}
    return json.dumps(_strip({"node": node, "named_param_map": statement["named_param_map"]}), sort_keys=True)


def _select_item(tree: dict[str, Any], label: str) -> dict[str, Any]:
    """The one select item of a parsed ``SELECT <expression>``; refuse anything around it."""
    statements = tree.get("statements") or []
    if len(statements) != 1:
        raise BadPredicateError(f"{label} is not a single expression: it holds {len(statements)} statements (a ; ends one)")
    statement = statements[0]
    node = statement.get("node") or {}
    if statement.get("named_param_map"):
        raise BadPredicateError(f"{label} is refused: it contains a parameter placeholder ($1, ?); write the value itself")
    items = node.get("select_list") or []
    rest = {k: v for k, v in node.items() if k != "select_list"}
    shape = json.dumps(_strip({"node": rest, "named_param_map": statement.get("named_param_map")}), sort_keys=True)
    if shape != _bare_select() or len(items) != 1:
        raise BadPredicateError(
            f"{label} is not a single expression: the text around it adds to the statement (a closing parenthesis, a comma, "
            "DISTINCT, FROM, WHERE, GROUP BY, UNION, ...); write one expression over the table's columns"
        )
    return items[0]  # type: ignore[no-any-return]


def _render(tree: dict[str, Any], item: dict[str, Any], label: str) -> str:
    """DuckDB's SQL for ``item`` (in place of the select item of ``tree``)."""
    statement = tree["statements"][0]
    out = {**tree, "statements": [{**statement, "node": {**statement["node"], "select_list": [item]}}]}
    with duck.scratch() as con:
        import duckdb  # loaded: the connection is open

        try:
            sql = con.execute("SELECT json_deserialize_sql(?::JSON)", [json.dumps(out)]).fetchone()[0]  # type: ignore[index]
        except duckdb.Error as exc:
            raise BadPredicateError(f"{label} could not be rendered back to SQL: {exc}") from None
    if not isinstance(sql, str) or not sql.startswith("SELECT "):
        raise BadPredicateError(f"{label} could not be rendered back to SQL (got {sql!r})")
    return sql[len("SELECT "):]


def _has_comment(text: str) -> bool:
    """Whether the tokenizer finds a comment in ``text``.

    DuckDB's Python tokenizer drops comments without a trace, so sqlglot's
    (DuckDB dialect), which keeps them, is asked. A comment it misses is
    harmless: only the re-rendered tree ever runs, and comments are not in it.
    """
    if "--" not in text and "/*" not in text:
        return False  # no comment can start without one of these (and tokenizing long IN lists is slow)
    from sqlglot.dialects.duckdb import DuckDB
    from sqlglot.errors import SqlglotError

    try:
        tokens = DuckDB().tokenize(text)
    except (SqlglotError, ValueError):
        return False
    return any(t.comments for t in tokens)


@lru_cache(maxsize=256)
def _function_kind(name: str) -> str | None:
    """DuckDB's type for the function ``name`` (scalar, macro, aggregate, table, ...), None if unknown."""
    with duck.scratch() as con:
        kinds = [r[0] for r in con.execute("SELECT DISTINCT function_type FROM duckdb_functions() WHERE function_name = ?", [name]).fetchall()]
    for kind in ("table", "table_macro", "aggregate"):
        if kind in kinds:
            return kind
    return kinds[0] if kinds else None


# ---------------------------------------------------------------- the check


class _Walker:
    """Checks (and, when ``rewrite`` is set, binds) every node of one expression tree."""

    def __init__(self, columns: tuple[str, ...], label: str, *, rewrite: bool) -> None:
        self.exact = set(columns)
        self.lower: dict[str, list[str]] = {}
        for c in columns:
            self.lower.setdefault(c.lower(), []).append(c)
        self.columns = columns
        self.label = label
        self.rewrite = rewrite
        self.used: list[str] = []

    def refuse(self, what: str) -> BadPredicateError:
        return BadPredicateError(f"{self.label} is refused: it contains {what}; {_ALLOWED}")

    def visit(self, node: Any, parent: str | None) -> Any:
        """Check ``node`` (a parse-tree value) and return it, bound and normalised."""
        try:
            return self._visit(node, parent)
        except RecursionError:
            raise BadPredicateError(f"{self.label} is nested too deeply") from None

    def _visit(self, node: Any, parent: str | None) -> Any:
        if isinstance(node, list):
            return [self._visit(v, parent) for v in node]
        if not isinstance(node, dict):
            return node
        cls = node.get("class")
        if cls is None:  # a part of a node (a CASE branch, a type, ...): its expressions are checked one by one
            return {k: self._visit(v, parent) for k, v in node.items()}
        if cls not in allowlist.NODE_CLASSES:
            raise self.refuse(allowlist.REFUSED_NODE_CLASSES.get(cls, f"the construct {cls}"))
        if node.get("alias") and parent != "struct_pack":
            raise self.refuse(f"an alias ({node['alias']!r}: a name after the expression)")
        if cls == "OPERATOR" and node.get("type") not in allowlist.OPERATOR_TYPES:
            raise self.refuse(f"the operator {node.get('type')}")
        if cls == "COLUMN_REF":
            return self._column(node)
        if cls == "CONSTANT":
            return self._constant(node)
        name = None
        if cls == "FUNCTION":
            name = self._function(node)
        return {k: self._visit(v, name) for k, v in node.items()}

    def _function(self, node: dict[str, Any]) -> str:
        name = str(node.get("function_name", "")).lower()
        if node.get("catalog") or node.get("schema") not in ("", "main", None):
            raise self.refuse(f"the qualified function name {node.get('catalog') or ''}.{node.get('schema')}.{name}()")
        if node.get("filter") or (node.get("order_bys") or {}).get("orders") or node.get("distinct") or node.get("export_state"):
            raise self.refuse(f"an aggregate clause on {name}() (FILTER, ORDER BY, DISTINCT)")
        if name not in allowlist.FUNCTIONS and name not in allowlist.OPERATORS:
            raise self.refuse(allowlist.refusal(name, _function_kind(name)))
        if name in allowlist.BOUNDED:
            problem = allowlist.bounded_refusal(name, _literal(node.get("children") or [], allowlist.BOUNDED[name]))
            if problem:
                raise self.refuse(problem)
        return name

    def _column(self, node: dict[str, Any]) -> dict[str, Any]:
        names = [str(n) for n in node.get("column_names") or []]
        real = names[0] if names and names[0] in self.exact else None
        if real is None and names and len(self.lower.get(names[0].lower(), [])) == 1:
            real = self.lower[names[0].lower()][0]
        if real is None:
            low = names[0].lower() if names else ""
            if len(names) == 1 and (low in allowlist.NONDETERMINISTIC or low in allowlist.ENVIRONMENT):
                raise self.refuse(allowlist.refusal(low, None))
            if len(names) > 1:
                raise self.refuse(f"the qualified name {'.'.join(names)} ({names[0]!r} is not a column; columns are written alone)")
            raise UnknownColumnError(f"{self.label} names a column the table does not have: {names[0]!r} (columns: {list(self.columns)})")
        if not self.rewrite and names != [real]:
            raise BadPredicateError(f"{self.label} could not be rendered faithfully (column {'.'.join(names)}); please report this")
        if real not in self.used:
            self.used.append(real)
        out: dict[str, Any] = {**node, "column_names": [real]}
        for field in names[1:]:  # s.f on a struct column: s['f'], which cannot be read as table s, column f
            out = {"class": "OPERATOR", "type": "ARRAY_EXTRACT", "alias": "", "children": [out, _string_constant(field)]}
        return out

    def _constant(self, node: dict[str, Any]) -> dict[str, Any]:
        value = node.get("value") or {}
        if (value.get("type") or {}).get("id") in ("DOUBLE", "FLOAT") and not value.get("is_null"):
            # DuckDB renders a DOUBLE constant as a decimal literal, which reads back as DECIMAL: keep the type explicitly.
            if not self.rewrite:
                raise BadPredicateError(f"{self.label} could not be rendered faithfully (a floating-point literal); please report this")
            return {"class": "CAST", "type": "OPERATOR_CAST", "alias": "", "child": _string_constant(repr(float(value["value"]))),
                    "cast_type": {"id": "DOUBLE", "type_info": None}, "try_cast": False}
        return node


_LITERAL_TYPES = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "VARCHAR"})


def _literal(children: list[Any], position: int) -> object:
    """The value of the whole-number or string literal at ``position``; allowlist.NOT_A_LITERAL for anything else.

    Anything else: an expression, a missing argument, NULL, or a literal of another type (a DECIMAL's value
    in the tree is its unscaled integer, and a HUGEINT's a pair of words).
    """
    node = children[position] if position < len(children) else None
    if not isinstance(node, dict) or node.get("class") != "CONSTANT":
        return allowlist.NOT_A_LITERAL
    value = node.get("value") or {}
    if value.get("is_null") or (value.get("type") or {}).get("id") not in _LITERAL_TYPES:
        return allowlist.NOT_A_LITERAL
    return value.get("value")


def _string_constant(text: str) -> dict[str, Any]:
    return {"class": "CONSTANT", "type": "VALUE_CONSTANT", "alias": "", "value": {"type": {"id": "VARCHAR", "type_info": None}, "is_null": False, "value": text}}


_ALLOWED = (
    "an expression may use the table's columns, literals, operators, CASE, CAST, IN (...), BETWEEN, LIKE and "
    "deterministic scalar functions only (see 'What a where may contain' in the README)"
)
