"""The commands' bodies: what ``rebalancer <command>`` does, apart from its flags and its output.

One module per command of ``rebalancer.cli``, under the same name: ``reclaim`` (the wave, and
standing the controller down first), ``check``, ``capacity``, ``explain``, ``pools`` (the pools
file and its writes) and ``gpu_labeler``. ``run`` and ``audit`` have none: the one's body is the
controller itself (``runtime.wiring``), the other's a read of the audit store
(``adapters.audit``). They sit above the runtime, which imports nothing of them, and below the
command line, which parses the flags and prints.
"""
