"""The project's harnesses, kept out of the controller's package, wheel and image.

- ``emulator``: a Kubernetes API emulator served over real HTTP (``rebalancer sandbox``);
- ``sim``: the what-if simulator, real traces replayed through the strategies and the planner
  (``rebalancer simulate``);
- ``demo``: the controller, wired as ``rebalancer run`` wires it, on the emulated cluster while a
  real day of traffic is replayed (``rebalancer demo``).

Installed as its own distribution (``rebalancer-sandbox``, ``sandbox/pyproject.toml``). It adds
its commands to the ``rebalancer`` command through the ``rebalancer.commands`` entry points
(``cli``); the controller never imports it.
"""
