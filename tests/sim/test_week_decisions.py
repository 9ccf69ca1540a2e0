"""The simulator's decisions on the Azure ``code`` week, held minute for minute.

The simulator is made fast without changing what it decides (docs/design/simulator-speed.md):
every run here must make the same steps in the same minutes, on the same nodes, and show the
same timeline and figures as the planner did before it was made fast. Each run is reduced to a
digest of its per-minute steps (action, node, notice), its per-minute timeline and its figures;
the digests below were recorded on the tree before the speed work.

A change that means to change decisions (a strategy's rule, a planner's guard) changes a digest
here on purpose: record the new ones with ``python -m tests.sim.test_week_decisions`` (run with
the project and ``sandbox`` on ``PYTHONPATH``) and say in the commit why the decisions moved.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from rebalancer.adapters import registry
from rebalancer.core import model
from sandbox.sim import engine, traces
from sandbox.sim.simulate import BASELINES, _oracle

TRACE = Path(__file__).parents[2] / "examples" / "traces" / "azure_llm_2024_week_per_minute.csv"
POOL = engine.PoolModel(size=16, zone="America/Los_Angeles")
# Recorded before the simulator was made fast: the default, the baselines and the oracle.
RECORDED = {
    "adaptive": "b6e4b389a92b2419238a882792e5f1d5d8f115666cb995725ef6fa75ae5cf519",
    "static": "d96c14474d6891b1860568fb1a3f87a0908476c97008095717796448e193dd46",
    "cron": "01b426d8c33695c1f65555d23021674d183588aa3b8872d29b056126cd83edca",
    "reactive": "0a82e5ac2886692aa070b70ba6952da547ed9a02592c6c61c392b1b9df4853d1",
    "oracle": "c105ffca152cc52990e8d4b4addc4a697f9c6ca34beaf98bb9ae993d165c85f7",
    "adaptive-quiet": "09bc7bf6077ae821448349a5b4d6a0932211bd1dda7dc8e3aa7a517d8ba19659",
}


def quiet(trace: traces.Trace) -> traces.Trace:
    """Two days of ``trace`` with stretches without traffic: an hour of exact zeros every seven
    hours and a 20-minute gap every day, so that ``adaptive``'s busy windows part from its
    plain ones (the ``code`` week never stops)."""
    rps = [
        None if t % 1440 in range(600, 620) else 0.0 if t // 60 % 7 == 3 else r
        for t, r in enumerate(trace.rps[: 2 * 1440])
    ]
    return dataclasses.replace(trace, name=f"{trace.name}, quiet", rps=rps)


def digest(name: str) -> str:
    """The run of ``name`` on the ``code`` week (``adaptive-quiet``: ``adaptive`` on its
    ``quiet`` days), reduced to a digest of every minute's steps and timeline, and of its
    figures."""
    trace = traces.load(TRACE, "code")
    if name == "adaptive-quiet":
        name, trace = "adaptive", quiet(trace)
    seen = hashlib.sha256()

    def steps(t: int, taken: tuple[model.Step, ...]) -> None:
        moves = [(s.action.value, s.node, s.notice.total_seconds()) for s in taken]
        seen.update(repr((t, moves)).encode())

    if name == "oracle":
        need = engine.needs(trace, POOL, POOL.capacity(trace))
        run = engine.run(trace, _oracle(trace, POOL, need, None), POOL, True, on_steps=steps)
    else:
        baseline = name in BASELINES
        run = engine.run(trace, registry.build(name), POOL, baseline, on_steps=steps)
    for m in run.timeline:
        minute = (m.time.isoformat(), m.demand_rps, m.need, m.serving, m.lent, m.returning, m.queue)
        seen.update(repr(minute).encode())
    f = run.figures
    hours = (f.lent_node_hours, f.oracle_node_hours, f.harvest_ratio)
    counts = (f.breach_minutes, f.headroom_minutes, f.reclaims, f.loans, f.short_loans)
    seen.update(repr((*hours, *counts, f.notices, f.withdrawals)).encode())
    return seen.hexdigest()


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_week_is_decided_as_it_was_minute_for_minute(name: str) -> None:
    assert digest(name) == RECORDED[name]


if __name__ == "__main__":
    print(json.dumps({name: digest(name) for name in RECORDED}, indent=1))
