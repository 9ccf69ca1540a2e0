"""What a changed settings file changes, and which of it the running controller takes without
a restart (docs/design/live-settings.md).

Where it sits: ``runtime.livesettings`` reads the file again when its content changes, loads
it (``load``: a broken file is refused whole, there), and asks ``reload`` here what to run by:
the new file's live fields on the running settings' restart-only ones, and each change said
as applied or as waiting for a restart. Pure: two ``Settings`` in, values out.

Why these fields wait for a restart: each is wired into something built once at start-up
(``runtime.wiring``) that a reload does not build again. The listen address and TLS (a bound
socket), the Lease and its timings (a running election), the audit store (an open pool of
connections), Prometheus and each pool's queries and Alertmanager selectors (their clients
and stores), the key prefix and the node-state key (what every reader and writer of node
state signs and reads), the cluster's name (on every metric, Event and record), dry run (the
writer and the Events are built for it or not), the tick interval (the loop's trigger), and
which pools there are and in what order (each has its metrics client, alert selectors and
watch). Everything else, each pool's limits, window, strategy and its parameters, capacity,
error budget, taints and labels, and the switches that pause or freeze, is read afresh by the
next tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from rebalancer import errors
from rebalancer.settings.controller import Settings
from rebalancer.settings.pool import PoolSettings

RESTART_ONLY: frozenset[str] = frozenset(
    {
        "cluster_name",
        "key_prefix",
        "node_state_keys",
        "dry_run",
        "tick_interval",
        "leader_election",
        "prometheus",
        "audit",
        "http",
        "alertmanager",
        "takers",
    }
)
# A pool's fields wired into the adapters built for it (its Prometheus client and queries, its
# Alertmanager selectors, the informer's watch of pending pods).
POOL_RESTART_ONLY: frozenset[str] = frozenset({"metrics", "wake_on", "lend_only_to_takers"})

ABSENT = "(none)"  # the value of a pool on the side that does not have it


@dataclass(frozen=True)
class Change:
    """One setting whose value differs: its path (``paused``, ``pools[l20].limits.max_lent``),
    both values as shown in a log line, and whether the running controller takes it."""

    path: str
    old: str
    new: str
    live: bool

    def line(self) -> str:
        """One line naming the field and both values, and whether it waits for a restart."""
        said = f"{self.path}={self.new} (was {self.old})"
        if self.live:
            return said
        return f"{said}: needs a restart, the running value is kept until then"


@dataclass(frozen=True)
class Reload:
    """What to run by after a reload, and what of the file it took and left."""

    settings: Settings
    applied: tuple[Change, ...]
    held: tuple[Change, ...]

    @property
    def result(self) -> str:
        """``applied``, ``restart_needed`` (something waits for a restart; the rest applied)
        or ``unchanged`` (the file changed, the settings it loads to did not)."""
        if self.held:
            return "restart_needed"
        return "applied" if self.applied else "unchanged"


def reload(running: Settings, loaded: Settings) -> Reload:
    """The settings to run by when ``loaded`` is read while ``running`` runs: every live change
    taken, every restart-only one kept at its running value and said."""
    found = changes(running, loaded)
    return Reload(
        settings=taken(running, loaded),
        applied=tuple(c for c in found if c.live),
        held=tuple(c for c in found if not c.live),
    )


def taken(running: Settings, loaded: Settings) -> Settings:
    """``loaded``'s live fields on ``running``'s restart-only ones: the running pools, in
    their order, each with the file's live fields; a pool added or removed waits for a
    restart."""
    by_name = {p.name: p for p in loaded.pools}
    pools = tuple(_pool_taken(p, by_name.get(p.name)) for p in running.pools)
    kept = {name: getattr(running, name) for name in RESTART_ONLY}
    return loaded.model_copy(update={**kept, "pools": pools})


def _pool_taken(running: PoolSettings, loaded: PoolSettings | None) -> PoolSettings:
    if loaded is None:
        return running
    return loaded.model_copy(update={f: getattr(running, f) for f in POOL_RESTART_ONLY})


def changes(running: Settings, loaded: Settings) -> tuple[Change, ...]:
    """Every setting that differs, top-level fields first, then each pool's by name."""
    old, new = _fields(running), _fields(loaded)
    out = [
        _change(
            path, old.get(path), new.get(path), path.split(".", maxsplit=1)[0] not in RESTART_ONLY
        )
        for path in sorted(old.keys() | new.keys())
        if old.get(path) != new.get(path)
    ]
    return (*out, *_pool_changes(running.pools, loaded.pools))


def _pool_changes(
    running: tuple[PoolSettings, ...], loaded: tuple[PoolSettings, ...]
) -> list[Change]:
    before, after = {p.name: p for p in running}, {p.name: p for p in loaded}
    out = []
    for name in sorted(before.keys() | after.keys()):
        if name not in after or name not in before:
            was, now = ("a pool", "removed") if name in before else (ABSENT, "added")
            out.append(Change(f"pools[{name}]", was, now, False))
            continue
        old, new = _fields(before[name]), _fields(after[name])
        out.extend(
            _change(f"pools[{name}].{path}", old.get(path), new.get(path), _pool_live(path))
            for path in sorted(old.keys() | new.keys())
            if old.get(path) != new.get(path)
        )
    order = [p.name for p in loaded if p.name in before]
    if order != [p.name for p in running if p.name in after]:
        out.append(Change("pools", _names(running), _names(loaded), False))
    return out


def _pool_live(path: str) -> bool:
    return path.split(".", maxsplit=1)[0] not in POOL_RESTART_ONLY


def _names(pools: tuple[PoolSettings, ...]) -> str:
    return "[" + ", ".join(p.name for p in pools) + "]"


def _change(path: str, old: object, new: object, live: bool) -> Change:
    return Change(path, shown(old), shown(new), live)


def _fields(block: Settings | PoolSettings) -> dict[str, object]:
    """The block's values by dotted path, nested blocks flattened, pools left out (compared by
    name); values compared as Python values (a secret by its value)."""
    dumped = {name: getattr(block, name) for name in type(block).model_fields if name != "pools"}
    out: dict[str, object] = {}
    _flatten("", dumped, out)
    return out


def _flatten(prefix: str, value: object, out: dict[str, object]) -> None:
    fields = getattr(type(value), "model_fields", None)
    if fields is not None:
        value = {name: getattr(value, name) for name in fields}
    if isinstance(value, Mapping) and (fields is not None or not prefix):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), inner, out)
        return
    out[prefix] = value


def shown(value: object) -> str:
    """A value as a log line shows it: a duration in seconds, a secret masked, text quoted
    when it needs to be (``errors.shown``)."""
    if value is None:
        return "null"
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return errors.shown(value)
    return _plain(value)


def _plain(value: Any) -> str:
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        return str(dump(mode="json"))
    return str(value)
