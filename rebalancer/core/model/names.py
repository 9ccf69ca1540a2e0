"""The names every other room of the model refers to (a node's, a pool's) and the one clock type;
a room of their own so that each of the others imports them and nothing else of the model."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import NewType

NodeName = NewType("NodeName", str)
PoolName = NewType("PoolName", str)
Clock = Callable[[], datetime]  # the one clock type: every seam that reads time is given one
