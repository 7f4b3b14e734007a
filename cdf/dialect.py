"""SQL dialects the change-feed definition is rendered in.

The definition in :mod:`cdf.plan` is written once against this small
interface; only identifier quoting and array helpers differ between engines.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """How one engine spells the few constructs that differ."""

    name: str
    quote: str
    array_open: str
    array_close: str
    filter_function: str
    size_function: str

    def ident(self, name: str) -> str:
        """Quote an identifier."""
        q = self.quote
        return q + name.replace(q, q + q) + q

    def string(self, value: str) -> str:
        """A string literal."""
        return "'" + value.replace("'", "''") + "'"

    def non_null_strings(self, items: list[str]) -> str:
        """An array of the non-null values of the string expressions ``items``."""
        if not items:
            return f"{self.filter_function}({self.array_open}CAST(NULL AS STRING){self.array_close}, x -> x IS NOT NULL)"
        return f"{self.filter_function}({self.array_open}{', '.join(items)}{self.array_close}, x -> x IS NOT NULL)"

    def size(self, expr: str) -> str:
        """Number of elements of an array expression."""
        return f"{self.size_function}({expr})"


DUCKDB = Dialect(name="duckdb", quote='"', array_open="[", array_close="]", filter_function="list_filter", size_function="len")
SPARK = Dialect(name="spark", quote="`", array_open="array(", array_close=")", filter_function="filter", size_function="size")
