"""The bench scripts are scripts, not a package (``bench/request_floor.py`` imports ``scale`` as
a sibling): tests of one import it the same way, with ``bench/`` on the path."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.append(BENCH)
