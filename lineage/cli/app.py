"""``main``: parse the arguments, run the command, turn errors into one line on stderr and an exit code."""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Sequence

from lineage.cli.context import EXIT_FAILURE, EXIT_USAGE, PROG, Context, first_line, log
from lineage.cli.format import Output, Progress, progress_enabled
from lineage.cli.parser import build_parser
from lineage.errors import InvalidArgumentError, LineageError


def _configure_logging(debug: bool, quiet: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.ERROR if quiet else logging.WARNING)
    for name in ("lineage", "cdf", "index"):
        logging.getLogger(name).setLevel(logging.DEBUG if debug else (logging.ERROR if quiet else logging.WARNING))


def _error(text: str, debug: bool = False, hint: str = "") -> None:
    """One short line on stderr (the full message with --debug)."""
    print(f"{PROG}: error: {text if debug else first_line(text)}{hint}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lineage`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on bad usage
    debug = bool(getattr(args, "debug", False))
    _configure_logging(debug, bool(args.quiet))
    started = time.perf_counter()
    ctx: Context | None = None
    try:
        progress = Progress(progress_enabled(bool(args.quiet)) and args.command != "demo")
        ctx = Context(args, Output(args.format, args.output, progress), progress)
        code = ctx.finish(args.func(ctx))  # what was skipped, and exit code 1 if any was skipped for an error
        log.debug("%s took %.2fs", args.command, time.perf_counter() - started)
        return code
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:
        # the reader went away (e.g. `lineage scan t | head`): stop quietly
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return EXIT_FAILURE
    except InvalidArgumentError as exc:
        if debug:
            traceback.print_exc()
        _error(str(exc), debug)
        return EXIT_USAGE
    except LineageError as exc:
        if debug:
            traceback.print_exc()
        _error(str(exc), debug)
        return EXIT_FAILURE
    except Exception as exc:
        if debug:
            traceback.print_exc()
        _error(f"{type(exc).__name__}: {exc}", debug, "" if debug else " (run with --debug for the traceback)")
        return EXIT_FAILURE
    finally:
        if ctx is not None:
            ctx.finish(EXIT_FAILURE)  # a command that failed still reports what it had skipped
