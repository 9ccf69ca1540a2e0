"""``python -m rebalancer.cli`` is the ``rebalancer`` command, as ``python -m rebalancer`` is."""

import sys

from rebalancer.cli import main

sys.exit(main())
