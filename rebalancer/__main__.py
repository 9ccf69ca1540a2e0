"""``python -m rebalancer`` is the ``rebalancer`` command."""

import sys

from rebalancer.cli import main

sys.exit(main())
