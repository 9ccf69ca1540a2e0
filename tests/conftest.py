"""Suite-wide settings.

Hypothesis: no per-example deadline. CI machines are small and shared; a slow example is not a
wrong one, and a timing failure would be a flaky test. Failures print the blob to reproduce them.
"""

from hypothesis import settings

settings.register_profile("rebalancer", deadline=None, print_blob=True)
settings.load_profile("rebalancer")
