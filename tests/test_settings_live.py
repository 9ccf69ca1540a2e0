"""``settings.live``: what a changed settings file changes, which of it runs at once, and what
waits for a restart (docs/design/live-settings.md). Pure: two ``Settings`` in."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from rebalancer import settings
from rebalancer.runtime import livesettings
from rebalancer.settings import live

POOL: dict[str, Any] = {"name": "l20", "node_selector": {"gpu": "l20"}, "rps_per_node": 10}
BASE: dict[str, Any] = {"pools": [POOL]}


def made(**changes: Any) -> settings.Settings:
    doc = copy.deepcopy(BASE)
    doc.update(changes)
    return settings.Settings.model_validate(doc)


def pool(**fields: Any) -> dict[str, Any]:
    return {**POOL, **fields}


def test_live_changes_are_taken_each_named_by_its_path_and_values() -> None:
    running = made()
    loaded = made(paused=True, pools=[pool(limits={"min_serving": 5}, window="Mon 01:00-02:00")])
    reloaded = live.reload(running, loaded)
    assert reloaded.result == "applied"
    assert reloaded.held == ()
    assert [c.line() for c in reloaded.applied] == [
        "paused=true (was false)",
        "pools[l20].limits.min_serving=5 (was 2)",
        "pools[l20].window='Mon 01:00-02:00' (was 'always')",
    ]
    assert reloaded.settings == loaded


def test_a_restart_only_change_is_kept_at_its_running_value_and_the_rest_taken() -> None:
    running = made()
    loaded = made(
        tick_interval="10s",
        leader_election={"lease_name": "other"},
        pools=[pool(limits={"min_serving": 5}, lend_only_to_takers=False)],
    )
    reloaded = live.reload(running, loaded)
    assert reloaded.result == "restart_needed"
    assert [c.path for c in reloaded.applied] == ["pools[l20].limits.min_serving"]
    assert [c.line() for c in reloaded.held] == [
        "leader_election.lease_name='other' (was 'rebalancer'): needs a restart, the running "
        "value is kept until then",
        "tick_interval=10s (was 30s): needs a restart, the running value is kept until then",
        "pools[l20].lend_only_to_takers=false (was true): needs a restart, the running value "
        "is kept until then",
    ]
    run = reloaded.settings
    assert run.tick_interval == running.tick_interval
    assert run.leader_election == running.leader_election
    assert run.pools[0].lend_only_to_takers is True
    assert run.pools[0].limits.min_serving == 5


def test_pools_added_removed_or_reordered_wait_for_a_restart() -> None:
    h100 = pool(name="h100", node_selector={"gpu": "h100"})
    running = made(pools=[POOL, h100])
    gone = live.reload(running, made(pools=[pool(paused=True)]))
    assert [c.line() for c in gone.held] == [
        "pools[h100]=removed (was a pool): needs a restart, the running value is kept until then"
    ]
    assert [p.name for p in gone.settings.pools] == ["l20", "h100"]  # still running both
    assert gone.settings.pools[0].paused  # the change to the pool kept is taken
    added = live.reload(made(), made(pools=[POOL, h100]))
    assert [(c.path, c.new) for c in added.held] == [("pools[h100]", "added")]
    assert [p.name for p in added.settings.pools] == ["l20"]
    swapped = live.reload(running, made(pools=[h100, POOL]))
    assert [c.line() for c in swapped.held] == [
        "pools=[h100, l20] (was [l20, h100]): needs a restart, the running value is kept until then"
    ]


def test_the_same_settings_written_otherwise_change_nothing() -> None:
    running = made(pools=[pool(limits={"staleness": "2m"})])
    loaded = made(pools=[pool(limits={"staleness": "120s"})])
    assert live.changes(running, loaded) == ()
    assert live.reload(running, loaded).result == "unchanged"


def test_a_secret_that_changes_is_seen_and_never_shown() -> None:
    running = made(http={"authentication": "none"}, alertmanager={"token": "old-secret"})
    loaded = made(http={"authentication": "none"}, alertmanager={"token": "new-secret"})
    (change,) = live.changes(running, loaded)
    assert change.path == "alertmanager.token"
    assert not change.live
    assert "secret" not in change.line()


@pytest.mark.parametrize(
    ("text", "result", "said"),
    [
        ("pools: [{name: l20, node_selector: {gpu: l20}, rps_per_node: 10}]\npaused: true\n",
         "applied", "paused=true (was false)"),
        ("pools: [{name: l20, node_selector: {gpu: l20}, rps_per_node: -1}]\n",
         "refused", "pools[0].rps_per_node=-1"),
        ("pools: [\n", "refused", "config.yaml"),
        ("pools: []\n", "refused", "pools=[]: the settings name no pool"),
    ],
)  # fmt: skip
def test_a_file_is_judged_as_loaded(tmp_path: Path, text: str, result: str, said: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    seen = livesettings.digest(path)
    assert seen is not None
    outcome = livesettings.judge(livesettings.SettingsSource(path, env={}), made(), seen)
    assert outcome.result == result
    assert said in outcome.summary()
    assert (outcome.settings is None) == (result == "refused")


def test_a_watch_judges_each_content_once_and_a_missing_file_as_no_change(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("pools: [{name: l20, node_selector: {gpu: l20}, rps_per_node: 10}]\n")
    watch = livesettings.SettingsWatch.of(livesettings.SettingsSource(path, env={}))
    running = made()
    assert watch.check(running) is None  # as it started
    path.write_text("pools: [{name: l20, node_selector: {gpu: l20}, rps_per_node: 20}]\n")
    outcome = watch.check(running)
    assert outcome is not None
    assert outcome.result == "applied"
    assert watch.check(running) is None  # judged already
    path.unlink()
    assert watch.check(running) is None  # between two swaps of a ConfigMap: no change


def test_a_configmap_swap_of_its_data_symlink_is_seen(tmp_path: Path) -> None:
    """The kubelet updates a ConfigMap volume by pointing ``..data`` at a new directory; the
    file's own path (a symlink through ``..data``) never changes."""
    first, second = tmp_path / "..2026_1", tmp_path / "..2026_2"
    for directory, rps in ((first, 10), (second, 20)):
        directory.mkdir()
        (directory / "config.yaml").write_text(
            f"pools: [{{name: l20, node_selector: {{gpu: l20}}, rps_per_node: {rps}}}]\n"
        )
    data = tmp_path / "..data"
    data.symlink_to(first.name)
    path = tmp_path / "config.yaml"
    path.symlink_to("..data/config.yaml")
    watch = livesettings.SettingsWatch.of(livesettings.SettingsSource(path, env={}))
    swap = tmp_path / "..data_tmp"
    swap.symlink_to(second.name)
    swap.replace(data)  # the kubelet's atomic rename
    outcome = watch.check(made())
    assert outcome is not None
    assert [line.split(" (")[0] for line in outcome.lines] == ["pools[l20].capacity.per_node=20.0"]


def test_the_command_line_is_applied_again_to_every_reload(tmp_path: Path) -> None:
    """``rebalancer run -n ml-serving --dry-run``: the flags stand over every reading of the file,
    so a reload that changes only a pool's limits changes nothing else, restart-only or not."""
    from rebalancer import cli
    from rebalancer.cli import run

    path = tmp_path / "config.yaml"
    path.write_text("pools: [{name: l20, node_selector: {gpu: l20}, rps_per_node: 10}]\n")
    args = cli.parse(["-n", "ml-serving", "run", "--dry-run", "--config", str(path)])
    adjust = run.adjusted(args)
    running = adjust(settings.load(path, env={}))
    assert (running.leader_election.lease_namespace, running.dry_run) == ("ml-serving", True)
    path.write_text("pools: [{name: l20, node_selector: {gpu: l20}, rps_per_node: 20}]\n")
    source = livesettings.SettingsSource(path, adjust, env={})
    seen = livesettings.digest(path)
    assert seen is not None
    outcome = livesettings.judge(source, running, seen)
    assert outcome.result == "applied"
    assert [line.split(" (")[0] for line in outcome.lines] == ["pools[l20].capacity.per_node=20.0"]


def documented(sentence: str) -> tuple[set[str], set[str]]:
    """The settings named in docs/configuration.md's sentence that starts ``sentence``: the
    top-level ones, and those after ``a pool's``."""
    doc = " ".join((Path(__file__).parents[1] / "docs" / "configuration.md").read_text().split())
    start = doc.index(sentence) + len(sentence)
    top, _, pools = doc[start : doc.index(".", start)].partition("a pool's")
    return set(re.findall(r"`(\w+)`", top)), set(re.findall(r"`(\w+)`", pools))


def test_the_documented_restart_only_settings_are_the_controllers() -> None:
    assert documented("The restart-only settings are:") == (
        set(live.RESTART_ONLY),
        set(live.POOL_RESTART_ONLY),
    )


def test_the_documented_live_settings_are_every_other_field() -> None:
    top, pools = documented("The live settings are:")
    assert top == set(settings.Settings.model_fields) - live.RESTART_ONLY - {"pools"}
    fields = {info.alias or name for name, info in settings.PoolSettings.model_fields.items()}
    assert pools == fields - live.POOL_RESTART_ONLY - {"name"}
