"""The audit store's default URL, in a module of its own that imports nothing.

Where it sits: ``settings.AuditSettings.url`` defaults to it, and ``audit.sql.SqlAuditStore.open``
opens it when given no URL. It lives outside the ``audit`` package because importing anything in
that package loads SQLAlchemy, and loading the settings must not.
"""

DEFAULT_URL = "sqlite+aiosqlite:///rebalancer-audit.sqlite3"
