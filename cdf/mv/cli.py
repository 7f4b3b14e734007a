"""``python -m cdf.mv refresh NAME --warehouse PATH``: the cron entry point of view refresh."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from cdf.mv.api import refresh
from cdf.mv.view import ENGINES
from lineage.errors import LineageError


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cdf.mv refresh NAME --warehouse PATH [--full] [--engine duckdb|spark] [--json]``."""
    parser = argparse.ArgumentParser(prog="python -m cdf.mv", description="Materialized views over lineage tables.", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("refresh", help="refresh a view from its source's change feed (exactly once; safe to run from cron)")
    p.add_argument("name", help="the view, namespace.table")
    p.add_argument("--warehouse", required=True, help="the warehouse folder (embedded SQLite catalog)")
    p.add_argument("--engine", choices=ENGINES, default="duckdb")
    p.add_argument("--full", action="store_true", help="recompute the whole query instead of applying the change feed")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("pyiceberg", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    spark = None
    try:
        if args.engine == "spark":
            from pyspark.sql import SparkSession

            spark = SparkSession.builder.appName(f"refresh {args.name}").getOrCreate()
        result = refresh(args.name, warehouse=args.warehouse, engine=args.engine, full=args.full, spark=spark)
    except LineageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json()) if args.json else str(result))
    return 0
