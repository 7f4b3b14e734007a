"""What a user-supplied SQL expression may contain, and why.

A ``where`` predicate, an ``update`` ``set`` value or a materialized view's
expression is data: it is typed by an operator into the CLI or stored in a
job's configuration, and it must only compute a value from one row. The
validator (:mod:`lineage.sql.expressions`) walks DuckDB's parse tree of the text
and accepts only the constructs listed here; everything else is refused by
name. The lists are deliberately closed: a function DuckDB adds in a later
release is refused until someone reads what it does and adds it here.

Rules, and the reason for each:

* **Literals, column references, operators, CASE, CAST/TRY_CAST/``::``,
  [NOT] BETWEEN, [NOT] IN (a list of expressions), IS [NOT] NULL,
  IS [NOT] DISTINCT FROM, [NOT] LIKE/ILIKE/SIMILAR TO/GLOB, COALESCE/IFNULL,
  NULLIF, COLLATE**: they compute a value from the row and nothing else.
* **Scalar functions from :data:`FUNCTIONS` only**: deterministic functions of
  their arguments (string, math, date/time, list/struct/map access).
* **No subqueries, EXISTS, table functions** (``read_csv``, ``read_parquet``,
  ``read_text``, ``glob``, ``query``, ...): they read other tables or files.
* **No functions that read the environment, settings or session**
  (``getenv``, ``current_setting``, ``current_user``, ``version``, ...).
* **No non-deterministic functions** (``random``, ``uuid``, ``now``,
  ``current_date``, one-argument ``age``, ``nextval``, ...): a write plans its
  rows and re-plans them after a lost commit race, so a predicate must select
  the same rows every time it is evaluated over the same data.
* **No aggregates or window functions**: a predicate or a ``set`` value is
  about one row (materialized views take their aggregates from their own
  grammar, not from this list).
* **No lambdas** (``list_transform(l, x -> ...)``): lambda parameters are
  names that are not columns, which the column check cannot bind; list
  predicates are available without them (``list_contains``, ``list_has_any``).
* **No functions whose cost is set by an argument** (``repeat``, ``range``,
  ``generate_series``, ``list_resize``, ``damerau_levenshtein``): one row could
  allocate gigabytes (``damerau_levenshtein`` keeps a matrix of one cell per
  pair of characters: two 20,000-character values take 3 GB), and DuckDB's
  memory limit does not see these allocations. Where the cost-setting argument
  can be bounded by writing it as a literal, the function is allowed with that
  argument only (:data:`BOUNDED`): the width of ``lpad``/``rpad`` must be a
  whole-number literal of at most :data:`MAX_WIDTH`, and the format string of
  ``format``/``printf`` a string literal whose widths and precisions are
  literals of at most :data:`MAX_WIDTH` (not ``*`` or ``{}``, which take them
  from an argument), read both ``{}``-style and ``%``-style (a view's
  expressions also run in Spark, whose ``format_string`` is ``%``-style).
* **No parameters, ``*``/``COLUMNS(...)``, positional references or aliases**:
  an expression is complete on its own and computes exactly one value.
"""

from __future__ import annotations

import re

# Node classes of DuckDB's parse tree (``json_serialize_sql``) an expression may contain.
NODE_CLASSES = frozenset({"CONSTANT", "COLUMN_REF", "COMPARISON", "CONJUNCTION", "OPERATOR", "BETWEEN", "CASE", "CAST", "FUNCTION", "COLLATE"})

# Node types of class OPERATOR that are allowed (NOT, IS [NOT] NULL, [NOT] IN, COALESCE, x[i], x[i:j]).
OPERATOR_TYPES = frozenset(
    {"OPERATOR_NOT", "OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL", "COMPARE_IN", "COMPARE_NOT_IN", "OPERATOR_COALESCE", "ARRAY_EXTRACT",
     "ARRAY_SLICE", "STRUCT_EXTRACT"}
)

# What the other node classes are, for the error message.
REFUSED_NODE_CLASSES = {
    "SUBQUERY": "a subquery",
    "WINDOW": "a window function",
    "STAR": "a star expression (* or COLUMNS(...))",
    "PARAMETER": "a parameter placeholder",
    "LAMBDA": "a lambda function",
    "LAMBDA_REF": "a lambda parameter",
    "POSITIONAL_REFERENCE": "a positional reference (#n)",
    "DEFAULT": "DEFAULT",
}

# Operators, as DuckDB's parser names them (a FUNCTION node with this name).
OPERATORS = frozenset(
    {
        "+", "-", "*", "/", "//", "%", "**", "^",  # arithmetic
        "&", "|", "<<", ">>", "~", "xor",  # bitwise
        "||",  # concatenation
        "~~", "!~~", "~~*", "!~~*", "~~~", "^@",  # LIKE, NOT LIKE, ILIKE, NOT ILIKE, GLOB (a string pattern), starts-with
        "@>", "<@", "&&",  # list contains / contained in / overlaps
        "@",  # absolute value
    }
)

# Deterministic scalar functions of their arguments, by family.
CONDITIONAL = {"nullif", "greatest", "least"}
NUMERIC = {
    "abs", "ceil", "ceiling", "floor", "round", "round_even", "roundbankers", "trunc", "sign", "signbit", "sqrt", "cbrt", "exp", "ln",
    "log", "log2", "log10", "pow", "power", "mod", "fmod", "fdiv", "isnan", "isinf", "isfinite", "even", "gcd", "lcm",
    "greatest_common_divisor", "least_common_multiple", "degrees", "radians", "pi", "sin", "cos", "tan", "cot", "asin", "acos",
    "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "bit_count", "add", "subtract", "multiply", "divide",
}
STRING = {
    "lower", "lcase", "upper", "ucase", "length", "len", "strlen", "char_length", "character_length", "octet_length", "bit_length",
    "substr", "substring", "left", "right", "trim", "ltrim", "rtrim", "replace", "concat", "concat_ws", "starts_with", "ends_with",
    "prefix", "suffix", "contains", "strpos", "instr", "position", "lpad", "rpad", "reverse", "split_part", "string_split",
    "str_split", "split", "regexp_matches", "regexp_full_match", "regexp_replace", "regexp_extract", "regexp_extract_all",
    "regexp_escape", "like_escape", "not_like_escape", "ilike_escape", "not_ilike_escape", "ascii", "chr", "unicode", "ord", "md5",
    "sha1", "sha256", "hash", "translate", "strip_accents", "nfc_normalize", "levenshtein", "hamming",
    "jaccard", "jaro_similarity", "jaro_winkler_similarity", "format", "printf", "hex", "to_hex", "unhex", "from_hex", "base64",
    "to_base64", "from_base64", "encode", "decode",
}
DATE_TIME = {
    "date_part", "datepart", "date_trunc", "datetrunc", "date_diff", "datediff", "date_sub", "datesub", "date_add", "year", "month",
    "day", "dayofmonth", "dayofweek", "dayofyear", "weekday", "isodow", "isoyear", "week", "weekofyear", "yearweek", "quarter", "hour",
    "minute", "second", "millisecond", "microsecond", "nanosecond", "epoch", "epoch_ms", "epoch_us", "epoch_ns", "era", "century",
    "decade", "millennium", "julian", "last_day", "dayname", "monthname", "make_date", "make_time", "make_timestamp",
    "make_timestamptz", "strftime", "strptime", "try_strptime", "to_timestamp", "timezone", "time_bucket", "to_days", "to_hours",
    "to_minutes", "to_seconds", "to_milliseconds", "to_microseconds", "to_weeks", "to_months", "to_quarters", "to_years",
    "to_decades", "to_centuries", "to_millennia", "normalized_interval",
}
NESTED = {
    "list_value", "list_pack", "array_value", "list_extract", "list_element", "array_extract", "element_at", "list_contains",
    "list_has", "array_contains", "array_has", "list_has_any", "list_has_all", "array_has_any", "array_has_all", "list_position",
    "list_indexof", "array_position", "array_indexof", "array_length", "cardinality", "list_slice", "array_slice", "list_concat",
    "list_cat", "array_concat", "array_cat", "list_append", "array_append", "list_prepend", "array_prepend", "list_distinct",
    "array_distinct", "list_sort", "array_sort", "list_reverse_sort", "array_reverse_sort", "list_min", "list_max", "list_sum",
    "flatten", "struct_extract", "struct_extract_at", "struct_pack", "row", "map", "map_extract", "map_extract_value", "map_keys",
    "map_values", "map_contains", "union_extract", "union_tag",
}
FUNCTIONS = frozenset(CONDITIONAL | NUMERIC | STRING | DATE_TIME | NESTED)

# Refused on purpose, with the reason given in the error message (any other name is refused as "not on the allow-list").
ENVIRONMENT = frozenset(
    {
        "getenv", "current_setting", "getvariable", "current_database", "current_catalog", "current_schema", "current_schemas",
        "current_user", "current_role", "session_user", "user", "version", "current_query", "current_query_id",
        "current_connection_id", "current_transaction_id", "txid_current", "in_search_path", "inet_client_addr", "inet_client_port",
        "inet_server_addr", "inet_server_port", "pg_postmaster_start_time", "pg_conf_load_time", "get_block_size", "stats",
        "json_serialize_sql", "json_serialize_plan", "json_deserialize_sql", "parse_path", "parse_dirname", "parse_dirpath",
        "parse_filename",
    }
)
NONDETERMINISTIC = frozenset(
    {
        "random", "setseed", "uuid", "gen_random_uuid", "uuidv4", "uuidv7", "nextval", "currval", "now", "today", "current_date",
        "current_time", "current_timestamp", "get_current_time", "get_current_timestamp", "transaction_timestamp", "current_localtime",
        "current_localtimestamp", "localtime", "localtimestamp", "age", "ago", "sleep_ms", "pg_sleep", "write_log", "error",
    }
)
RESOURCE = frozenset(
    {"repeat", "range", "generate_series", "generate_subscripts", "list_resize", "array_resize", "bar", "damerau_levenshtein"}
)
# Allowed functions whose cost one argument sets, by the position of that argument: it must be a literal that bounds
# the cost (see bounded_refusal).
BOUNDED = {"lpad": 1, "rpad": 1, "format": 0, "printf": 0}
MAX_WIDTH = 4096  # characters: the widest lpad/rpad result, and the largest format/printf width or precision
NOT_A_LITERAL = object()  # what the checker passes to bounded_refusal for an argument that is not a literal
# Table functions that read files, other tables or the catalog; DuckDB's catalog classifies the rest.
TABLE_FUNCTIONS = frozenset(
    {
        "read_csv", "read_csv_auto", "read_parquet", "parquet_scan", "read_json", "read_json_auto", "read_ndjson", "read_json_objects",
        "read_text", "read_blob", "glob", "query", "query_table", "iceberg_scan", "iceberg_metadata", "iceberg_snapshots", "delta_scan",
        "read_xlsx", "sqlite_scan", "postgres_scan", "mysql_scan", "read_avro", "parquet_metadata", "parquet_schema", "sniff_csv",
        "duckdb_settings", "duckdb_tables", "duckdb_functions", "duckdb_secrets", "unnest",
    }
)


def refusal(name: str, kind: str | None) -> str:
    """Why the function ``name`` (DuckDB function type ``kind``, if DuckDB knows it) is refused, for the error message."""
    if name in TABLE_FUNCTIONS or kind in ("table", "table_macro"):
        return f"the table function {name}() (an expression may not read files or other tables)"
    if name in ENVIRONMENT:
        return f"the function {name}() (it reads the environment, settings or session, not the row)"
    if name in NONDETERMINISTIC:
        return f"the non-deterministic function {name}() (a predicate must select the same rows every time it is evaluated)"
    if name in RESOURCE:
        return f"the function {name}() (its cost is set by an argument)"
    if kind == "aggregate":
        return f"the aggregate function {name}() (an expression is about one row)"
    if kind is None:
        return f"the function {name}(), which DuckDB does not know"
    return f"the function {name}(), which is not on the allow-list of scalar functions"


def bounded_refusal(name: str, value: object) -> str | None:
    """Why the call of the :data:`BOUNDED` function ``name`` is refused, or None if its cost-setting argument bounds it.

    ``value`` is that argument's literal value (a Python int or str), or
    :data:`NOT_A_LITERAL` when it is an expression, a column or missing.
    """
    if name in ("lpad", "rpad"):
        if isinstance(value, int) and not isinstance(value, bool) and value <= MAX_WIDTH:
            return None
        if value is NOT_A_LITERAL:
            shown = "a width that is not a whole-number literal"
        else:
            shown = f"the width {value if isinstance(value, int) else _short(str(value))}"
        return (f"the function {name}() with {shown} (its cost is set by the width: write it as a whole-number literal of at "
                f"most {MAX_WIDTH:,} characters)")
    if not isinstance(value, str):
        return (f"the function {name}() with a format string that is not a string literal (its cost is set by the format's "
                "widths, which must be literals)")
    # Read both ways: a materialized view's expressions also run in Spark, whose format_string reads a format printf-style.
    problem = _fmt_problem(value) or _printf_problem(value)
    if problem is None:
        return None
    return f"the function {name}() with the format {_short(value)}: {problem} (its cost is set by the format's widths)"


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _numbers_problem(spec: str) -> str | None:
    """Whether a field spec has a number (width, precision, index) above MAX_WIDTH."""
    for digits in re.findall(r"\d+", spec):
        significant = digits.lstrip("0")
        if len(significant) > len(str(MAX_WIDTH)) or int(significant or "0") > MAX_WIDTH:
            return f"the field {_short(spec)} has the width or precision {digits}, above the limit of {MAX_WIDTH:,}"
    return None


def _fmt_problem(text: str) -> str | None:
    """``format``'s fields are ``{[index][:spec]}`` (``{{`` is a brace); a ``{`` inside a field takes a width from an argument."""
    i = 0
    while i < len(text):
        if text.startswith("{{", i) or text.startswith("}}", i):
            i += 2
        elif text[i] == "{":
            end = text.find("}", i + 1)
            if end < 0:
                return "a field is not closed"
            field = text[i + 1:end]
            if "{" in field:
                return "a field takes its width or precision from an argument (a {} inside the field)"
            problem = _numbers_problem(field)
            if problem:
                return problem
            i = end + 1
        else:
            i += 1
    return None


_PRINTF_FLAGS = frozenset("0123456789-+ #'.$*hlLjzqtI,(<")  # C's flags and length modifiers, and Java's , ( <


def _printf_problem(text: str) -> str | None:
    """``printf``'s fields are ``%[flags][width][.precision][length]type`` (``%%`` is a percent sign); ``*`` takes a number from an argument."""
    i = 0
    while i < len(text):
        if text[i] != "%":
            i += 1
            continue
        if text.startswith("%%", i):
            i += 2
            continue
        end = i + 1
        while end < len(text) and text[end] in _PRINTF_FLAGS:
            end += 1
        spec = text[i:end + 1]
        if "*" in spec:
            return f"the field {_short(spec)} takes its width or precision from an argument (*)"
        problem = _numbers_problem(spec)
        if problem:
            return problem
        i = end + 1
    return None
