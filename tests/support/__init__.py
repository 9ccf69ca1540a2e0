"""What the tests share: fakes, builders, waits, and the servers and processes they start.

No test module is imported by another; whatever two tests need lives here, once.

- ``factories``: node views in every phase (built with the node-state codec), policies, plans.
- ``observers``: ``Seen``, a recording ``Observer`` of the Reconciler.
- ``prometheus``: a real Prometheus, backfilled with a trace (the metrics adapter's data).
- ``postgres``: a throwaway PostgreSQL server (``initdb``, ``pg_ctl``) for the audit store.
- ``processes``: the chart's Deployment as a local process, the fake vLLM exporter, RBAC helpers.
- ``harness``: emulator, exporter, Prometheus and the controller process, for process tests.
- ``failing_strategy``: ``python -m tests.support.failing_strategy``, ``rebalancer`` with one
  more strategy, which raises.
- ``chart``: the Helm chart rendered by Helm's own engine.
"""
