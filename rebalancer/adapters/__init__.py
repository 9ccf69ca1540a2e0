"""Adapters: all I/O, each behind a small seam the runtime wires together.

``convert`` turns API objects (the JSON the API server sends) into the core's values. The
Kubernetes client, the informer cache, the actuator and the leader lease live beside it. Adapters
import the core, never the runtime.
"""
