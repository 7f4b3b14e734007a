"""The reference page of the table properties, ``docs/reference/properties.md``, generated from :mod:`lineage.properties`.

``python -m lineage.properties_page`` rewrites the page (run it from the
repository root); ``python -m lineage.properties_page --check`` exits 1 when
the committed page is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lineage.properties import TableProperty, registry

PAGE = Path("docs") / "reference" / "properties.md"


def page() -> str:
    """The Markdown page ``docs/reference/properties.md``: every registered property by group."""
    lines = [
        "# Table properties",
        "",
        "<!-- Generated from lineage/properties.py by `python -m lineage.properties_page`; do not edit by hand. -->",
        "",
        "Set them with `create_table(..., properties={...})` or any Iceberg engine (`ALTER TABLE ... SET TBLPROPERTIES`).",
        "A bad value is refused with `InvalidArgumentError` naming the property when the library reads it.",
        "Properties marked *Iceberg* are Iceberg's own, with Iceberg's meaning and default.",
        "",
    ]
    groups: dict[str, list[TableProperty]] = {}
    for prop in registry.values():
        groups.setdefault(prop.group, []).append(prop)
    for group, props in groups.items():
        lines += [f"## {group}", "", "| Property | Type | Default | Description |", "|---|---|---|---|"]
        for p in props:
            kind = "set by the library" if p.kind == "managed" else p.bounds()
            default = "unset" if p.default is None else f"`{str(p.default).lower() if isinstance(p.default, bool) else p.default}`"
            owner = " *(Iceberg)*" if p.owner == "iceberg" else ""
            lines.append(f"| `{p.name}`{owner} | {kind} | {default} | {p.description} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Write the page (or with ``--check`` compare it); the exit status."""
    text = page()
    if "--check" in argv:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE} is out of date: run python -m lineage.properties_page", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
