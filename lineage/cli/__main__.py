"""``python -m lineage.cli``: the same as the ``lineage`` console script."""

import sys

from lineage.cli import main

sys.exit(main())
