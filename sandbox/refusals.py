"""The demo's refusals for want of a taker, grouped: a line per pool and reason, with a count.

The planner's sentence for such a refusal (``core.planning.rooms.why_no_taker``) names up to
three waiting jobs and why no node would run each, pod by pod. It comes every tick the strategy
wants more nodes than any job would use; in the demo that is hundreds of times a day, always
for the same few jobs (the Hopper jobs, which no pool can run). Printed as they came they were
lines of 550 characters about the same jobs; grouped by pool and by the sentence's head, with
the kinds of jobs named and what each kind asks for, a pool's refusals read in one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sandbox import training

WIDTH = 120  # characters a printed line may take: one terminal line
_JOB = re.compile(r"\bjob ([\w.-]+/[\w.-]+): ")
_COUNT = re.compile(r" \(\d+\)")


@dataclass
class Refusals:
    """The refusals of one pool that share a reason: how many, for how many nodes, and the
    jobs their sentences named."""

    count: int = 0
    nodes: int = 0
    jobs: set[str] = field(default_factory=set)


def head(message: str) -> str:
    """The reason of a refusal's sentence without its particulars: the words before the first
    job it names, counts left out (``every pending job (3) fits ...``)."""
    return _COUNT.sub("", message.split(": ", 1)[0]).strip()


def jobs_named(message: str) -> list[str]:
    """The jobs (``namespace/name``) a refusal's sentence names, in its order."""
    return _JOB.findall(message)


def kind_of(job: str, kinds: Sequence[training.Kind] = training.KINDS) -> training.Kind | None:
    """The kind of a demo job by its name (``training/hopper-006`` is a ``hopper`` job)."""
    name = job.rsplit("/", 1)[-1].rsplit("-", 1)[0]
    return next((k for k in kinds if k.name == name), None)


def need(kind: training.Kind) -> str:
    """What a kind of job asks a node for, shortly: ``gpu.family In hopper``."""
    return ", ".join(
        f"{str(n['key']).removeprefix('nvidia.com/')} {n['operator']} {','.join(n['values'])}"
        for n in kind.needs
    )


def named(jobs: set[str], kinds: Sequence[training.Kind] = training.KINDS) -> str:
    """The jobs by kind, most first: ``6 48gb, 2 hopper``; a job of no known kind by its name."""
    by_kind: dict[str, int] = {}
    for job in jobs:
        kind = kind_of(job, kinds)
        label = kind.name if kind is not None else job
        by_kind[label] = by_kind.get(label, 0) + 1
    ranked = sorted(by_kind.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{n} {label}" for label, n in ranked)


def needs(jobs: set[str], kinds: Sequence[training.Kind] = training.KINDS) -> str:
    """What each kind of the jobs asks for: ``48gb: gpu.memory Gt 40000; hopper: ...``."""
    found = {k.name: k for k in (kind_of(job, kinds) for job in jobs) if k is not None}
    return "; ".join(f"{name}: {need(found[name])}" for name in sorted(found))


def fit(line: str, width: int = WIDTH) -> str:
    """``line`` cut to ``width`` characters, marked where cut."""
    return line if len(line) <= width else line[: width - 3] + "..."


def brief(message: str) -> str:
    """A refusal's sentence in a line: its reason and the jobs it named."""
    jobs = jobs_named(message)
    return head(message) + (f"; waiting: {named(set(jobs))}" if jobs else "")


def add(groups: dict[str, Refusals], message: str, nodes: int) -> None:
    """Count a refusal for ``nodes`` nodes under its reason."""
    group = groups.setdefault(head(message), Refusals())
    group.count += 1
    group.nodes += nodes
    group.jobs.update(jobs_named(message))


def lines(pools: Mapping[str, Mapping[str, Refusals]], indent: str = "    ") -> list[str]:
    """One line per pool and reason, ``l20   362 ticks, 469 nodes in all: <reason>; waiting:
    6 48gb, 2 hopper``, then what each kind of job named asks for, in a line."""
    out, every = [], set()
    for pool, groups in pools.items():
        for reason, g in groups.items():
            jobs = f"; waiting: {named(g.jobs)}" if g.jobs else ""
            out.append(
                fit(f"{indent}{pool:<6}{g.count} ticks, {g.nodes} nodes in all: {reason}{jobs}")
            )
            every |= g.jobs
    if every:
        out.append(fit(f"{indent}{'':<6}({needs(every)})"))
    return out
