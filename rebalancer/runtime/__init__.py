"""The runtime: wiring the core and the adapters into the controller that runs.

``reconcile`` (one level-triggered step: observe, decide, plan, audit, apply, audit),
``loop`` (the APScheduler job, wake-ups, shutdown), ``http`` (``/metrics``, probes, the audit
read API) and ``telemetry`` (the controller's own metrics). Adapters never import the runtime.
"""
