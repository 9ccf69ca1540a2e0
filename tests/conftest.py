"""Suite-wide settings.

Hypothesis: no per-example deadline. CI machines are small and shared; a slow example is not a
wrong one, and a timing failure would be a flaky test. Failures print the blob to reproduce them.

``tests.support`` holds checks too (``reads``, ``actuation``, ``harness``...): its asserts are
rewritten like a test module's, so a failing one shows the values it compared. This runs before
any test module imports it.
"""

import pytest
from hypothesis import settings

pytest.register_assert_rewrite("tests.support")

settings.register_profile("rebalancer", deadline=None, print_blob=True)
settings.load_profile("rebalancer")
