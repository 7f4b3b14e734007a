"""``python -m cdf.mv``: see :func:`cdf.mv.cli.main`."""

import sys

from cdf.mv.cli import main

sys.exit(main())
