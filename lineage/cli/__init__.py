"""``lineage``: the operator CLI for row-lineage Iceberg tables.

Run ``lineage --help`` (or ``python -m lineage.cli --help``). Global options
(``--warehouse``, ``--catalog``, ``--format``, ``--output``, ``--quiet``,
``--debug``) go before the subcommand (they are also accepted after it).

Exit codes: 0 success; 1 failure (missing table, lost commit race, corrupt
metadata, ``verify`` found problems, ...); 2 bad usage (unknown option,
invalid argument value, bad version range, retention window, bad ``--where``).
Expected errors print one short line on stderr; ``--debug`` adds the traceback.

Layout: :mod:`~lineage.cli.app` (``main``), :mod:`~lineage.cli.parser` (the
argument parser), :mod:`~lineage.cli.context` (what every command shares), one
module per group of commands (:mod:`~lineage.cli.tables`,
:mod:`~lineage.cli.reads`, :mod:`~lineage.cli.writes`,
:mod:`~lineage.cli.maintenance`, :mod:`~lineage.cli.mv`), and their helpers
:mod:`~lineage.cli.option_values` (argument values), :mod:`~lineage.cli.format`
(output), :mod:`~lineage.cli.report` (``log --plot``) and :mod:`~lineage.cli.demo`.
"""

from lineage.cli.app import main

__all__ = ["main"]
