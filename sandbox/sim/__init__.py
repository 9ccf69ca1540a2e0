"""The what-if simulator: real traces replayed through the same strategies and planner.

``traces`` reads load files, ``history`` makes one of a pool's demand history in Prometheus,
``configured`` models a configured pool from its settings and the command's flags, ``pool`` is
the fake node pool, ``nights`` is the pool's clock (its window, its nights), ``engine`` runs the
minutes and scores them, ``report`` writes the results, ``simulate`` ties them together for the
CLI.
"""
