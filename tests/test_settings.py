"""Settings: defaults, the example file, env over file, one clear line per bad field, builders."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from rebalancer import settings
from rebalancer.adapters import auditurl, leadership, metrics, presets, promql
from rebalancer.core import model, nodestate, windows
from rebalancer.core.policy import PoolPolicy, default_lend_spec
from rebalancer.errors import ConfigError
from rebalancer.runtime import adapterconfig
from rebalancer.settings.queries import HISTORY_PLACEHOLDERS, QUERY_PLACEHOLDERS, SCOPE_PLACEHOLDERS

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "config.yaml"

POOL: dict[str, Any] = {"name": "l20", "node_selector": {"gpu": "l20"}, "rps_per_node": 10}


def write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc), encoding="utf-8")
    return path


def errors(path: Path | None, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(settings.InvalidSettings) as info:
        settings.load(path, env or {})
    assert isinstance(info.value, ConfigError)
    assert str(info.value) == "\n".join(info.value.lines)
    return info.value.lines


# ---------------------------------------------------------------------------------------------
# Loading


def test_defaults_load_without_a_file() -> None:
    s = settings.load(None, {})
    assert s.pools == ()
    assert s.key_prefix == "rebalancer.io/"
    assert (s.dry_run, s.paused, s.log_level) == (False, False, "INFO")
    assert s.tick_interval == timedelta(seconds=30)
    assert s.clock_skew_bound == timedelta(seconds=30)
    assert s.leader_election.enabled
    assert s.prometheus.url == "http://127.0.0.1:9090"
    assert (s.http.port, s.http.health_port) == (8443, 8081)
    assert s.http.authentication == "kubernetes"  # closed unless said otherwise
    assert s.audit.url == auditurl.DEFAULT_URL
    assert s.cluster_name == "default"


def test_the_default_cluster_name_is_the_one_old_audit_rows_were_given() -> None:
    from rebalancer.core import audit

    assert settings.Settings().cluster_name == audit.DEFAULT_CLUSTER


def test_cluster_name_from_the_file_and_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, {"cluster_name": "prod-eu-1"})
    assert settings.load(path, {}).cluster_name == "prod-eu-1"
    assert settings.load(path, {"REBALANCER_CLUSTER_NAME": "prod-us-2"}).cluster_name == (
        "prod-us-2"
    )
    assert errors(None, {"REBALANCER_CLUSTER_NAME": "prod.eu"}) == [
        "cluster_name='prod.eu': a cluster name is 1 to 63 lower-case letters, digits and '-', "
        "starting and ending with a letter or digit, e.g. prod-eu-1"
    ]


def test_process_environment_is_not_read_when_env_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REBALANCER_DRY_RUN", "true")
    assert settings.load(None, {}).dry_run is False
    assert settings.load(None).dry_run is True  # env=None: the process environment


def test_empty_file_is_every_default(tmp_path: Path) -> None:
    assert settings.load(write(tmp_path, ""), {}) == settings.load(None, {})


def test_example_file_loads() -> None:
    s = settings.load(EXAMPLE, {})
    assert [p.name for p in s.pools] == ["l20-chat", "l40s-rerank", "t4-embed"]
    l20, l40s, t4 = s.pools
    assert l20.zone == "Asia/Shanghai"
    assert l20.strategy == settings.StrategySettings()  # the default, written out
    assert l20.build_strategy().name == "adaptive"
    assert l20.slo == settings.DEFAULT_SLO  # the default, written out
    assert l40s.policy(s.keys()).window == windows.NEVER
    assert l40s.slo == settings.DEFAULT_SLO  # left out
    assert (t4.strategy.name, t4.strategy.params) == ("forecast", {"safety": 0.25})
    assert t4.build_strategy().name == "forecast"
    assert t4.slo is None  # slo: none
    # Every pool builds every value the runtime needs.
    for pool in s.pools:
        pool.policy(s.keys())
        pool.pod_marks(s.keys())
        adapterconfig.metrics_settings(s, pool)
    assert adapterconfig.metrics_settings(s, l20).queries.gpu_busy == promql.DCGM_GPU_BUSY


def test_env_overrides_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "dry_run": False,
            "prometheus": {"url": "http://file:9090", "attempts": 5},
            "pools": [POOL],
        },
    )
    env = {
        "REBALANCER_DRY_RUN": "true",
        "rebalancer_log_level": "debug",  # names and levels are case-insensitive
        "REBALANCER_PROMETHEUS__URL": "http://env:9090",
        "REBALANCER_LEADER_ELECTION__LEASE_NAMESPACE": "ml-platform",
        "REBALANCER_TICK_INTERVAL": "1m",
        "REBALANCER_CONFIG": "/ignored/here",  # the path, read by config_path, not a setting
        "OTHER_VARIABLE": "x",
    }
    s = settings.load(path, env)
    assert s.dry_run is True
    assert s.log_level == "DEBUG"
    assert s.prometheus.url == "http://env:9090"
    assert s.prometheus.attempts == 5  # the file's value, merged key by key
    assert s.leader_election.lease_namespace == "ml-platform"
    assert s.tick_interval == timedelta(minutes=1)
    assert [p.name for p in s.pools] == ["l20"]


def test_env_replaces_the_pool_list_as_json(tmp_path: Path) -> None:
    path = write(tmp_path, {"pools": [POOL]})
    other = {**POOL, "name": "a100", "limits": {"headroom": 0.5}}
    s = settings.load(path, {"REBALANCER_POOLS": json.dumps([other])})
    assert [(p.name, p.limits.headroom) for p in s.pools] == [("a100", 0.5)]


def test_config_path() -> None:
    assert settings.config_path(Path("a.yaml"), {"REBALANCER_CONFIG": "b.yaml"}) == Path("a.yaml")
    assert settings.config_path(None, {"REBALANCER_CONFIG": "b.yaml"}) == Path("b.yaml")
    assert settings.config_path(None, {}) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90s", 90), ("15m", 900), ("1h30m", 5400), ("2h", 7200), ("0", 0), (45, 45), ("1.5", 1.5)],
)
def test_durations(text: object, expected: float) -> None:
    loaded = settings.Settings.model_validate({"pools": [{**POOL, "limits": {"cooldown": text}}]})
    assert loaded.pools[0].limits.cooldown == timedelta(seconds=expected)


# ---------------------------------------------------------------------------------------------
# One line per bad field


def pool(**changes: Any) -> dict[str, Any]:
    return {"pools": [{**POOL, **changes}]}


BAD: list[tuple[str, object, str]] = [
    (
        "bad window",
        pool(window="Mon-Fry 22:00-06:00"),
        "pools[0].window='Mon-Fry 22:00-06:00': has days 'Mon-Fry'; "
        "write e.g. Mon-Fri, Sat,Sun, Fri-Mon or daily",
    ),
    (
        "unknown zone",
        pool(zone="Asia/Shangai"),
        "pools[0].zone='Asia/Shangai': unknown time zone; "
        "use an IANA name such as Asia/Shanghai or UTC",
    ),
    (
        "zone that is a directory",
        pool(zone="America"),
        "pools[0].zone='America': unknown time zone; use an IANA name such as Asia/Shanghai or UTC",
    ),
    (
        "unknown strategy",
        pool(strategy={"name": "magic"}),
        "pools[0].strategy.name='magic': unknown strategy; "
        "choose one of adaptive, cron, forecast, peak, reactive, static, watermark, window",
    ),
    (
        "bad strategy parameter",
        pool(strategy={"name": "forecast", "params": {"safety": -1}}),
        "pools[0].strategy.params.safety=-1: Input should be greater than or equal to 0",
    ),
    (
        "unknown strategy parameter",
        pool(strategy={"name": "watermark", "params": {"lowe": 0.3}}),
        "pools[0].strategy.params.lowe=0.3: Extra inputs are not permitted",
    ),
    (
        "negative headroom",
        pool(limits={"headroom": -0.1}),
        "pools[0].limits.headroom=-0.1: Input should be greater than or equal to 0",
    ),
    (
        "max lent fraction above 1",
        pool(limits={"max_lent_fraction": 1.5}),
        "pools[0].limits.max_lent_fraction=1.5: Input should be less than or equal to 1",
    ),
    (
        "bad duration",
        pool(limits={"cooldown": "15 minutes"}),
        "pools[0].limits.cooldown='15 minutes': write a duration such as 90s, 15m or 2h",
    ),
    (
        "negative duration",
        pool(limits={"warmup": -5}),
        "pools[0].limits.warmup=-5: must not be negative",
    ),
    (
        "zero rps per node",
        pool(rps_per_node=0),
        "pools[0].rps_per_node=0: Input should be greater than 0",
    ),
    (
        "no capacity",
        {"pools": [{"name": "l20", "node_selector": {"gpu": "l20"}}]},
        "pools[0].capacity: is required: what one warm node serves and in what unit, e.g. "
        "{unit: tokens_per_second, per_node: 2500} (units: requests_per_second, "
        "tokens_per_second, concurrent_sequences); rps_per_node: X is short for "
        "{unit: requests_per_second, per_node: X}",
    ),
    (
        "both capacity and rps per node",
        pool(capacity={"unit": "tokens_per_second", "per_node": 900}),
        # (the file is written with its keys sorted)
        "pools[0].capacity={'per_node': 900, 'unit': 'tokens_per_second'}: give capacity or "
        "rps_per_node, not both; rps_per_node: 10 is capacity: {unit: requests_per_second, "
        "per_node: 10}",
    ),
    (
        "a capacity unit that is none",
        {
            "pools": [
                {
                    "name": "l20",
                    "node_selector": {"gpu": "l20"},
                    "capacity": {"unit": "tokens", "per_node": 900},
                }
            ]
        },
        "pools[0].capacity.unit='tokens': Input should be 'requests_per_second', "
        "'tokens_per_second' or 'concurrent_sequences'",
    ),
    (
        "a bad rps per node is refused under its own name",
        pool(rps_per_node=0),
        "pools[0].rps_per_node=0: Input should be greater than 0",
    ),
    (
        "a capacity of nothing per node",
        {
            "pools": [
                {
                    "name": "l20",
                    "node_selector": {"gpu": "l20"},
                    "capacity": {"unit": "concurrent_sequences", "per_node": 0},
                }
            ]
        },
        "pools[0].capacity.per_node=0: Input should be greater than 0",
    ),
    (
        "a preset that is none",
        pool(metrics={"preset": "ollama"}),
        "pools[0].metrics.preset='ollama': Input should be 'vllm', 'sglang', 'tgi' or 'triton'",
    ),
    (
        "a preset without the pool's unit",
        {
            "pools": [
                {
                    "name": "l20",
                    "node_selector": {"gpu": "l20"},
                    "capacity": {"unit": "tokens_per_second", "per_node": 900},
                    "metrics": {"preset": "triton"},
                }
            ]
        },
        "pools[0].metrics.preset='triton': pool 'l20': has no tokens_per_second query "
        "(Triton's own metrics count requests, not tokens; a TensorRT-LLM backend's token "
        "metrics differ from version to version); write metrics.demand and metrics.history "
        "yourself, or choose a capacity.unit it has: requests_per_second, concurrent_sequences",
    ),
    (
        "empty node selector",
        pool(node_selector={}),
        "pools[0].node_selector={}: a pool needs at least one label to select its nodes",
    ),
    (
        "bad pool name",
        pool(name="L20 Pool"),
        "pools[0].name='L20 Pool': a pool name is lower-case letters, digits and '-', "
        "e.g. l20-serving",
    ),
    (
        "bad taint",
        pool(serving_taints=["workload=inference"]),
        "pools[0].serving_taints[0]='workload=inference': write a taint as key=value:Effect "
        "or key:Effect, Effect one of NoSchedule, PreferNoSchedule, NoExecute",
    ),
    (
        "unquoted YAML boolean as a label value",
        "pools:\n- {name: l20, rps_per_node: 1, node_selector: {inference: true}}\n",
        "pools[0].node_selector.inference=True: must be text; quote it in YAML: 'true'",
    ),
    (
        "limits not a mapping",
        pool(limits=5),
        "pools[0].limits=5: must be a mapping of settings (key: value)",
    ),
    (
        "duplicate pool",
        {"pools": [POOL, {**POOL, "rps_per_node": 5}]},
        "pools[1].name='l20': duplicate pool name; pools[0] has it already",
    ),
    (
        "unknown pool key",
        pool(lend="never"),
        "pools[0].lend='never': unknown setting; known: name, node_selector, serving_taints, "
        "serving_labels, lent_taints, lent_labels, inference_selector, lend_only_to_takers, "
        "zone, window, strategy, paused, frozen, rps_per_node, capacity, limits, metrics, slo, "
        "wake_on",
    ),
    (
        "slo with both figures",
        pool(slo={"max_breach_minutes": 10, "availability": 0.999}),
        "pools[0].slo={'availability': 0.999, 'max_breach_minutes': 10}: give "
        "max_breach_minutes or availability, exactly one of them",
    ),
    (
        "slo with neither figure",
        pool(slo={"window": "24h"}),
        "pools[0].slo={'window': '24h'}: give max_breach_minutes or availability, "
        "exactly one of them",
    ),
    (
        "slo as a word other than none",
        pool(slo="off"),
        "pools[0].slo='off': write none (no error budget) or a mapping such as "
        "{availability: 0.999} or {max_breach_minutes: 10}; left out, a pool has "
        "{availability: 0.999}",
    ),
    (
        "slo none with a capital",
        pool(slo="None"),
        "pools[0].slo='None': write none (no error budget) or a mapping such as "
        "{availability: 0.999} or {max_breach_minutes: 10}; left out, a pool has "
        "{availability: 0.999}",
    ),
    (
        "slo as a bare availability",
        pool(slo=0.999),
        "pools[0].slo=0.999: write none (no error budget) or a mapping such as "
        "{availability: 0.999} or {max_breach_minutes: 10}; left out, a pool has "
        "{availability: 0.999}",
    ),
    (
        "slo false",
        "pools:\n- {name: l20, rps_per_node: 1, node_selector: {gpu: l20}, slo: false}\n",
        "pools[0].slo=False: write none (no error budget) or a mapping such as "
        "{availability: 0.999} or {max_breach_minutes: 10}; left out, a pool has "
        "{availability: 0.999}",
    ),
    (
        "slo availability above one",
        pool(slo={"availability": 99.9}),
        "pools[0].slo.availability=99.9: Input should be less than or equal to 1",
    ),
    (
        "slo minutes below zero",
        pool(slo={"max_breach_minutes": -1}),
        "pools[0].slo.max_breach_minutes=-1: Input should be greater than or equal to 0",
    ),
    (
        "unknown top-level key",
        {"dryrun": True},
        "dryrun=True: unknown setting; known: cluster_name, key_prefix, node_state_keys, dry_run, "
        "paused, frozen, "
        "tick_interval, strategy_timeout, clock_skew_bound, lend_concurrency, log_level, "
        "leader_election, prometheus, audit, http, alertmanager, pools, takers",
    ),
    (
        "cluster name with capitals and an underscore",
        {"cluster_name": "Prod_EU"},
        "cluster_name='Prod_EU': a cluster name is 1 to 63 lower-case letters, digits and '-', "
        "starting and ending with a letter or digit, e.g. prod-eu-1",
    ),
    (
        "cluster name longer than a label",
        {"cluster_name": "c" * 64},
        f"cluster_name='{'c' * 64}': a cluster name is 1 to 63 lower-case letters, digits and "
        "'-', starting and ending with a letter or digit, e.g. prod-eu-1",
    ),
    (
        "empty cluster name",
        {"cluster_name": ""},
        "cluster_name='': a cluster name is 1 to 63 lower-case letters, digits and '-', "
        "starting and ending with a letter or digit, e.g. prod-eu-1",
    ),
    (
        "cluster name as a YAML number",
        "cluster_name: 7\n",
        "cluster_name=7: must be text; quote it in YAML: '7'",
    ),
    (
        "bad key prefix",
        {"key_prefix": "Rebalancer"},
        "key_prefix='Rebalancer': must be a DNS subdomain followed by '/', e.g. 'rebalancer.io/'",
    ),
    (
        "leader election timings out of order",
        {"leader_election": {"renew_deadline": "20s"}},
        "leader_election: needs retry_period < renew_deadline < lease_duration, got 2s, 20s, 15s",
    ),
    (
        "prometheus url",
        {"prometheus": {"url": "prometheus:9090"}},
        "prometheus.url='prometheus:9090': write an http:// or https:// URL, "
        "e.g. http://prometheus:9090",
    ),
    (
        "lookback not in whole seconds",
        {"prometheus": {"lookback": "1.5s"}},
        "prometheus.lookback='1.5s': must be a whole number of seconds > 0",
    ),
    (
        "audit store without its driver",
        {"audit": {"url": "mysql://u@h/db"}},
        "audit.url='mysql://u@h/db': the audit log is kept in SQLite (sqlite+aiosqlite:///PATH) "
        "or PostgreSQL (postgresql+asyncpg://USER@HOST/DB)",
    ),
    (
        "a clock skew bound finer than the API server states its clock",
        {"clock_skew_bound": 0.5},
        "clock_skew_bound=0.5: must be at least 1s: the API server states its clock to the second",
    ),
    (
        "a clock skew bound that is not a duration",
        {"clock_skew_bound": "soon"},
        "clock_skew_bound='soon': write a duration such as 90s, 15m or 2h",
    ),
    (
        "a duration past any time",
        {"tick_interval": 1e30},
        "tick_interval=1e+30: must be at most 100 years",
    ),
    (
        "port",
        {"http": {"port": 70000}},
        "http.port=70000: Input should be less than or equal to 65535",
    ),
    (
        "an authentication the controller does not know",
        {"http": {"authentication": "anonymous"}},
        "http.authentication='anonymous': Input should be 'kubernetes' or 'none'",
    ),
    (
        "the probes on the API's port",
        {"http": {"port": 9000, "health_port": 9000}},
        "http: port and health_port are both 9000: the probes have a port of their own",
    ),
    (
        "a certificate without its key",
        {"http": {"tls": {"cert_file": "/etc/tls/tls.crt"}}},
        "http.tls: cert_file is set but key_file is not: give both (a certificate and its "
        "key), or neither for a self-signed certificate",
    ),
    (
        "a shared receiver token with the cluster's authentication",
        {"alertmanager": {"token": "s3cret"}},
        "alertmanager: token is set but http.authentication is kubernetes: Alertmanager sends a "
        "service-account token (docs/http.md#alertmanager); unset it, or set "
        "http.authentication to none",
    ),
    (
        "log level",
        {"log_level": "loud"},
        "log_level='LOUD': Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR'",
    ),
    (
        "pools not a list",
        {"pools": {"name": "l20"}},
        "pools={'name': 'l20'}: Input should be a valid list",
    ),
    (
        "a query template with an unknown placeholder",
        pool(metrics={"queue": {"value": 'sum(q{ns="$namespace"})', "sampled": "$scope"}}),
        "pools[0].metrics.queue.value='sum(q{ns=\"$namespace\"})': pool 'l20': unknown "
        "placeholder $namespace; this template may use $scope, $nodes, $pool ($$ for a literal $)",
    ),
    (
        "a value alone that reads none of the preset's series: its sampled cannot be guessed",
        pool(metrics={"demand": {"value": "sum(my_requests)"}}),
        "pools[0].metrics.demand.sampled: is required where value reads none of the preset's "
        "series: when the series value reads were last scraped, scoped to the pool, e.g. "
        "'timestamp(my_metric) and on (namespace, pod) $scope' (docs/configuration.md, metrics)",
    ),
    (
        "a history template with a placeholder only the others have",
        pool(metrics={"scope": 'kube_pod_info{node=~"$nodes"} and $window'}),
        "pools[0].metrics.scope='kube_pod_info{node=~\"$nodes\"} and $window': pool 'l20': "
        "unknown placeholder $window; this template may use $nodes, $pool ($$ for a literal $)",
    ),
    (
        "a PromQL $1 not written $$1",
        pool(
            metrics={
                "gpu_busy": {
                    "value": 'label_replace(g, "node", "$1", "h", "(.*)")',
                    "sampled": "timestamp(g)",
                }
            }
        ),
        'pools[0].metrics.gpu_busy.value=\'label_replace(g, "node", "$1", "h", "(.*)")\': '
        "pool 'l20': a '$' at character 27 starts no placeholder; write $$ for a literal $ "
        "(this template may use $scope, $nodes, $pool)",
    ),
    (
        "a 5,000-character value is cut",
        {"tick_interval": "9" * 4999 + "x"},
        f"tick_interval='{'9' * 79}… (5000 characters): write a duration such as 90s, 15m or 2h",
    ),
    (
        "a 5,000-character template is cut",
        pool(metrics={"history": "r" * 4990 + "$interval"}),
        f"pools[0].metrics.history='{'r' * 79}… (4999 characters): pool 'l20': unknown "
        "placeholder $interval; this template may use $scope, $nodes, $pool, $window "
        "($$ for a literal $)",
    ),
    (
        "non-mapping YAML",
        "- name: l20\n",
        "config file '{path}': must be a mapping of settings (key: value), not a list",
    ),
    (
        "YAML that does not parse",
        "pools: [\n",
        "config file '{path}': not valid YAML at line 2, column 1: "
        "expected the node content, but found '<stream end>'",
    ),
]


@pytest.mark.parametrize(("doc", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_value_gives_one_line(tmp_path: Path, doc: object, expected: str) -> None:
    path = write(tmp_path, doc)
    assert errors(path) == [expected.replace("{path}", str(path))]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert errors(path) == [f"config file '{path}': does not exist"]


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert errors(tmp_path) == [f"config file '{tmp_path}': is a directory, not a file"]


BAD_ENV: list[tuple[str, dict[str, str], str]] = [
    (
        "unknown variable",
        {"REBALANCER_DRYRUN": "1"},
        "REBALANCER_DRYRUN='1': unknown setting; known: REBALANCER_CLUSTER_NAME, "
        "REBALANCER_KEY_PREFIX, REBALANCER_NODE_STATE_KEYS, REBALANCER_DRY_RUN, "
        "REBALANCER_PAUSED, REBALANCER_FROZEN, "
        "REBALANCER_TICK_INTERVAL, "
        "REBALANCER_STRATEGY_TIMEOUT, REBALANCER_CLOCK_SKEW_BOUND, REBALANCER_LEND_CONCURRENCY, "
        "REBALANCER_LOG_LEVEL, "
        "REBALANCER_LEADER_ELECTION, REBALANCER_PROMETHEUS, REBALANCER_AUDIT, REBALANCER_HTTP, "
        "REBALANCER_ALERTMANAGER, "
        "REBALANCER_POOLS, REBALANCER_TAKERS",
    ),
    (
        "pools not JSON",
        {"REBALANCER_POOLS": "l20"},
        "REBALANCER_POOLS='l20': not JSON (Expecting value: line 1 column 1 (char 0)); "
        "write this setting as JSON",
    ),
    (
        "bad boolean",
        {"REBALANCER_DRY_RUN": "maybe"},
        "dry_run='maybe': Input should be a valid boolean, unable to interpret input",
    ),
    (
        "unknown nested key",
        {"REBALANCER_PROMETHEUS__URI": "http://p:9090"},
        "prometheus.uri='http://p:9090': unknown setting; known: url, timeout, attempts, "
        "retry_budget, backoff, lookback, resolution, "
        "bearer_token_file, basic_auth, tls, headers, method",
    ),
]


@pytest.mark.parametrize(
    "name",
    [
        "REBALANCER_SERVICE_HOST",
        "REBALANCER_PORT_8443_TCP_ADDR",
        "REBALANCER_PROD_SERVICE_PORT_HTTPS",
    ],
)
def test_a_variable_the_kubelet_sets_for_a_service_says_how_to_stop_it(name: str) -> None:
    """Seen on a real kubelet: the chart's Service is named rebalancer, and every pod of its
    namespace gets REBALANCER_SERVICE_HOST and the rest unless its spec turns service links off."""
    (line,) = errors(None, {name: "10.0.0.1"})
    assert line.startswith(f"{name}='10.0.0.1': unknown setting; known: ")
    assert line.endswith("set the pod's enableServiceLinks: false, as the chart does)")
    (typo,) = errors(None, {"REBALANCER_DRYRUN": "1"})
    assert "enableServiceLinks" not in typo


@pytest.mark.parametrize(("env", "expected"), [b[1:] for b in BAD_ENV], ids=[b[0] for b in BAD_ENV])
def test_bad_environment_gives_one_line(env: dict[str, str], expected: str) -> None:
    assert errors(None, env) == [expected]


def test_every_error_is_reported_at_once(tmp_path: Path) -> None:
    doc = {
        "dry_run": "perhaps",
        "bogus": 1,
        "pools": [
            {
                **POOL,
                "window": "Mon-Fry 22:00-06:00",
                "zone": "Mars/Olympus",
                "strategy": {"name": "forecast", "params": {"safety": -1, "fit_minutes": 1}},
                "limits": {"headroom": -1, "min_serving": -2},
            },
            {**POOL, "strategy": {"name": "nope"}},
        ],
    }
    lines = errors(write(tmp_path, doc), {"REBALANCER_HTTP__PORT": "0"})
    assert sorted(lines) == sorted(
        [
            "pools[1].name='l20': duplicate pool name; pools[0] has it already",
            "dry_run='perhaps': Input should be a valid boolean, unable to interpret input",
            "http.port='0': Input should be greater than or equal to 1",
            "pools[0].zone='Mars/Olympus': unknown time zone; "
            "use an IANA name such as Asia/Shanghai or UTC",
            "pools[0].window='Mon-Fry 22:00-06:00': has days 'Mon-Fry'; "
            "write e.g. Mon-Fri, Sat,Sun, Fri-Mon or daily",
            "pools[0].strategy.params.fit_minutes=1: Input should be greater than or equal to 10",
            "pools[0].strategy.params.safety=-1: Input should be greater than or equal to 0",
            "pools[0].limits.min_serving=-2: Input should be greater than or equal to 0",
            "pools[0].limits.headroom=-1: Input should be greater than or equal to 0",
            "pools[1].strategy.name='nope': unknown strategy; "
            "choose one of adaptive, cron, forecast, peak, reactive, static, watermark, window",
            "bogus=1: unknown setting; known: cluster_name, key_prefix, node_state_keys, dry_run, "
            "paused, frozen, "
            "tick_interval, strategy_timeout, clock_skew_bound, lend_concurrency, log_level, "
            "leader_election, prometheus, audit, http, alertmanager, pools, takers",
        ]
    )


def test_a_window_without_zone_takes_the_pools_zone() -> None:
    s = settings.Settings.model_validate(pool(window="daily 22:00-06:00", zone="Asia/Shanghai"))
    (span,) = s.pools[0].parsed_window().spans
    assert str(span.zone) == "Asia/Shanghai"


# ---------------------------------------------------------------------------------------------
# Builders


def test_default_pool_builds_the_documented_values() -> None:
    s = settings.load(None, {"REBALANCER_POOLS": json.dumps([POOL])})
    keys = s.keys()
    assert keys == nodestate.Keys()
    (p,) = s.pools
    assert p.lend_spec(keys) == default_lend_spec(keys)
    assert p.policy(keys) == PoolPolicy(
        rps_per_node=10.0, lend_only_to_takers=True, reclaim_notice=timedelta(minutes=5)
    )
    assert p.pod_marks(keys) == model.PodMarks(
        lend_taints=(model.Taint(key="rebalancer.io/lent", value="training", effect="NoSchedule"),),
        serving_taints=(model.Taint(key="workload", value="inference", effect="NoSchedule"),),
    )
    assert adapterconfig.metrics_settings(s, p) == metrics.Settings()
    assert adapterconfig.metrics_settings(s) == metrics.Settings()
    assert adapterconfig.timings(s) == leadership.Timings()


@pytest.mark.parametrize(
    ("slo", "minutes", "window"),
    [
        ({"max_breach_minutes": 10}, 10, timedelta(days=7)),
        ({"availability": 0.999}, 10, timedelta(days=7)),  # 10.08 minutes: 10 may be spent
        ({"availability": 0.99, "window": "24h"}, 14, timedelta(days=1)),  # 14.4
        ({"availability": 1}, 0, timedelta(days=7)),
    ],
)
def test_a_pool_s_slo_is_an_error_budget_in_minutes(
    slo: dict[str, Any], minutes: int, window: timedelta
) -> None:
    (p,) = settings.load(None, {"REBALANCER_POOLS": json.dumps([{**POOL, "slo": slo}])}).pools
    assert p.slo is not None
    assert p.slo.slo() == model.Slo(minutes, window)


def test_a_pool_without_an_slo_has_an_error_budget_of_10_minutes_per_7_days() -> None:
    (p,) = settings.load(None, {"REBALANCER_POOLS": json.dumps([POOL])}).pools
    assert p.slo == settings.SloSettings(availability=0.999) == settings.DEFAULT_SLO
    assert p.slo.slo() == model.Slo(10, timedelta(days=7))


@pytest.mark.parametrize("text", ["slo: null", "slo: ~", "slo:"])
def test_an_slo_of_null_is_the_default_budget_as_if_left_out(tmp_path: Path, text: str) -> None:
    doc = f"pools:\n- name: l20\n  node_selector: {{gpu: l20}}\n  rps_per_node: 10\n  {text}\n"
    (p,) = settings.load(write(tmp_path, doc), {}).pools
    assert p.slo == settings.DEFAULT_SLO


def test_slo_none_gives_the_pool_no_error_budget(tmp_path: Path) -> None:
    doc = "pools:\n- {name: l20, node_selector: {gpu: l20}, rps_per_node: 10, slo: none}\n"
    (p,) = settings.load(write(tmp_path, doc), {}).pools
    assert p.slo is None
    (q,) = settings.load(None, {"REBALANCER_POOLS": json.dumps([{**POOL, "slo": "none"}])}).pools
    assert q.slo is None


def test_no_error_budget_is_dumped_as_the_word_that_loads_back_as_none() -> None:
    s = settings.Settings.model_validate({"pools": [{**POOL, "slo": "none"}, POOL]})
    dumped = s.model_dump()
    assert [p["slo"] for p in dumped["pools"]] == ["none", settings.DEFAULT_SLO.model_dump()]
    assert settings.Settings.model_validate(dumped) == s


def test_a_pool_without_a_strategy_runs_the_default_adaptive() -> None:
    (p,) = settings.Settings.model_validate(pool()).pools
    assert p.strategy == settings.StrategySettings(name="adaptive", params={})
    assert p.build_strategy().name == "adaptive"


def test_custom_pool_builds_its_values() -> None:
    doc = {
        "key_prefix": "gpu.example.com/",
        "prometheus": {"url": "http://p:9090", "timeout": "2s", "lookback": "5m"},
        "leader_election": {"lease_duration": "30s", "renew_deadline": "20s", "retry_period": 4},
        "pools": [
            {
                "name": "l20",
                "node_selector": {"gpu": "l20"},
                "serving_taints": [
                    "dedicated=vllm:NoSchedule",
                    {"key": "gpu", "effect": "NoExecute"},
                ],
                "serving_labels": {"role": "inference"},
                "lent_taints": ["spot:NoSchedule"],
                "lent_labels": {"role": "training", "pool": "borrowed"},
                "inference_selector": {"app": "vllm"},
                "lend_only_to_takers": False,
                "zone": "Asia/Shanghai",
                "window": "Mon-Fri 22:00-06:00",
                "rps_per_node": 12.5,
                "limits": {
                    "min_serving": 3,
                    "headroom": 0.3,
                    "max_lent_fraction": 0.5,
                    "min_loan": "30m",
                    "cooldown": "10m",
                    "max_step_fraction": 0.5,
                    "staleness": "90s",
                    "stale_grace": "3m",
                    "queue_limit": 4,
                    "reclaim_notice": "90s",
                    "reclaim_deadline": "1m",
                    "warmup": "8m",
                },
                "metrics": {
                    "queue": {"value": "sum(q)", "sampled": "timestamp(q)"},
                    "running": None,
                },
            }
        ],
    }
    s = settings.Settings.model_validate(doc)
    keys = s.keys()
    assert keys == nodestate.Keys(prefix="gpu.example.com/")
    (p,) = s.pools
    spec = nodestate.LendSpec(
        remove_taints=(
            model.Taint(key="dedicated", value="vllm", effect="NoSchedule"),
            model.Taint(key="gpu", effect="NoExecute"),
        ),
        add_taints=(model.Taint(key="spot", effect="NoSchedule"),),
        labels={"role": "training", "pool": "borrowed"},
        # What a restore from the specification writes back (docs/design/other-writers.md).
        serving_labels={"role": "inference"},
    )
    assert p.lend_spec(keys) == spec
    window = windows.parse("Mon-Fri 22:00-06:00", "Asia/Shanghai")
    assert isinstance(window, windows.Window)
    assert p.policy(keys) == PoolPolicy(
        rps_per_node=12.5,
        min_serving=3,
        headroom=0.3,
        max_lent_fraction=0.5,
        min_loan=timedelta(minutes=30),
        cooldown=timedelta(minutes=10),
        max_step_fraction=0.5,
        staleness=timedelta(seconds=90),
        stale_grace=timedelta(minutes=3),
        queue_limit=4.0,
        reclaim_notice=timedelta(seconds=90),
        reclaim_deadline=timedelta(minutes=1),
        warmup=timedelta(minutes=8),
        window=window,
        zone="Asia/Shanghai",
        lend_spec=spec,
    )
    assert p.pod_marks(keys) == model.PodMarks(
        lend_taints=spec.add_taints,
        serving_taints=spec.remove_taints,
        inference_selector={"app": "vllm"},
        prefix="gpu.example.com/",  # where its pods say when they last saved
    )
    assert adapterconfig.metrics_settings(s, p) == metrics.Settings(
        url="http://p:9090",
        timeout=2.0,
        lookback=timedelta(minutes=5),
        queries=promql.Queries(
            queue=promql.MetricQuery(value="sum(q)", sampled="timestamp(q)"), running=None
        ),
    )
    assert adapterconfig.timings(s) == leadership.Timings(
        lease_duration=30.0, renew_deadline=20.0, retry_period=4.0
    )
    # A serving label that lending does not set again is removed while lent.
    only_serving = settings.Settings.model_validate(pool(serving_labels={"role": "inference"}))
    assert only_serving.pools[0].lend_spec(keys).labels == {"role": None}


def test_lent_taint_follows_the_key_prefix() -> None:
    s = settings.Settings.model_validate({"key_prefix": "gpu.example.com/", **pool()})
    spec = s.pools[0].lend_spec(s.keys())
    assert spec.add_taints == (
        model.Taint(key="gpu.example.com/lent", value="training", effect="NoSchedule"),
    )


def test_the_default_pool_reads_vllm_in_requests_per_second_with_the_documented_promql() -> None:
    # The expression docs/design/metrics.md explains and tests/adapters/test_metrics.py holds
    # against a real Prometheus; the presets compose it, so it is written out here once.
    counter = "vllm:request_success_total"
    documented = (
        f"sum((((rate({counter}[5m]) and {counter} offset 5m) or (deriv({counter}[5m]) and "
        f"resets({counter}[5m]) == 0) or rate({counter}[5m])) and {counter}) * on (namespace, "
        "pod) group_left (node) $scope)"
    )
    (p,) = settings.Settings.model_validate(pool()).pools
    queries = adapterconfig.queries(p)
    assert queries.demand.value == documented
    assert queries.history == documented.replace("5m", "$window")
    assert queries == promql.Queries() == adapterconfig.metric_queries(settings.MetricsSettings())


# ---------------------------------------------------------------------------------------------
# Capacity in the pool's unit, and the servers' presets


def test_rps_per_node_is_a_capacity_in_requests_per_second() -> None:
    old = settings.Settings.model_validate(pool(rps_per_node=12.5)).pools[0]
    new = settings.Settings.model_validate(
        {
            "pools": [
                {
                    "name": "l20",
                    "node_selector": {"gpu": "l20"},
                    "capacity": {"unit": "requests_per_second", "per_node": 12.5},
                }
            ]
        }
    ).pools[0]
    assert old == new
    assert old.capacity == settings.CapacitySettings(
        unit=model.Unit.REQUESTS_PER_SECOND, per_node=12.5
    )
    # What the simulator reads, by the old name and the new.
    assert (old.unit, old.per_node, old.rps_per_node) == (
        model.Unit.REQUESTS_PER_SECOND,
        12.5,
        12.5,
    )
    # A dump says capacity only, and loads back the same.
    dumped = old.model_dump()
    assert "rps_per_node" not in dumped
    assert "given_rps_per_node" not in dumped
    assert settings.PoolSettings.model_validate(dumped) == old


@pytest.mark.parametrize(
    ("unit", "counted"),
    [
        ("tokens_per_second", "vllm:generation_tokens_total"),
        ("concurrent_sequences", "vllm:num_requests_running + vllm:num_requests_waiting"),
    ],
)
def test_the_unit_picks_the_demand_query_and_the_policy_counts_in_it(
    unit: str, counted: str
) -> None:
    s = settings.Settings.model_validate(
        {
            "pools": [
                {
                    "name": "l20",
                    "node_selector": {"gpu": "l20"},
                    "capacity": {"unit": unit, "per_node": 2400},
                }
            ]
        }
    )
    (p,) = s.pools
    queries = adapterconfig.metrics_settings(s, p).queries
    assert counted in queries.demand.value
    assert counted.split(" ", maxsplit=1)[0] in queries.history
    assert "vllm:request_success_total" not in queries.demand.value + queries.history
    assert queries.queue == promql.VLLM_QUEUE  # requests waiting, whatever the unit
    policy = p.policy(s.keys())
    assert (policy.unit, policy.rps_per_node) == (model.Unit(unit), 2400.0)
    assert p.rps_per_node == 2400.0  # in the pool's unit: the simulator's figure


@pytest.mark.parametrize(
    ("preset", "waiting", "running"),
    [
        ("vllm", "vllm:num_requests_waiting", "vllm:num_requests_running"),
        ("sglang", "sglang:num_queue_reqs", "sglang:num_running_reqs"),
        ("tgi", "tgi_queue_size", "tgi_batch_current_size"),
        ("triton", "nv_inference_pending_request_count", None),
    ],
)
def test_a_preset_brings_its_servers_queue_running_and_full_signal(
    preset: str, waiting: str, running: str | None
) -> None:
    (p,) = settings.Settings.model_validate(pool(metrics={"preset": preset})).pools
    m = p.metrics
    assert m.preset == preset
    assert m.queue.value == f"sum({waiting} * on (namespace, pod) group_left (node) $scope)" or (
        m.queue.value.startswith("sum(max without (tp_rank)")  # SGLang's ranks, folded
    )
    assert waiting in m.queue.value
    assert m.queue.sampled == f"timestamp({waiting}) and on (namespace, pod) $scope"
    if running is None:
        assert m.running is None
    else:
        assert m.running is not None
        assert running in m.running.value
    assert m.node_saturated.startswith("min by (node) (")
    assert f"min_over_time({waiting}[$window])" in m.node_saturated


def test_a_template_written_out_replaces_the_presets_and_running_null_stays_off() -> None:
    own = {"value": "sum(my_demand)", "sampled": "timestamp(my_demand)"}
    (p,) = settings.Settings.model_validate(
        pool(metrics={"preset": "tgi", "demand": own, "running": None})
    ).pools
    queries = adapterconfig.queries(p)
    assert queries.demand == promql.MetricQuery("sum(my_demand)", "timestamp(my_demand)")
    assert queries.running is None
    assert "tgi_queue_size" in queries.queue.value
    assert "tgi_request_success" in queries.history  # not written out: the preset's


def test_a_value_alone_that_reads_the_presets_series_is_sampled_by_their_scrape_times() -> None:
    # Only ``value`` written, as docs/configuration.md allows: ``sampled`` is the preset's own
    # series that the value reads, never ``timestamp()`` of the value (that is the query time).
    demand = 'sum(rate(sglang:generation_tokens_total{model="a"}[5m]) * on (namespace, pod) $scope)'
    queue = "sum(max without (tp_rank) (sglang:num_queue_reqs) * on (namespace, pod) $scope)"
    (p,) = settings.Settings.model_validate(
        pool(metrics={"preset": "sglang", "demand": {"value": demand}, "queue": {"value": queue}})
    ).pools
    queries = adapterconfig.queries(p)
    assert queries.demand == promql.MetricQuery(
        demand, "timestamp(sglang:generation_tokens_total) and on (namespace, pod) $scope"
    )
    assert queries.queue == promql.MetricQuery(
        queue, "timestamp(sglang:num_queue_reqs) and on (namespace, pod) $scope"
    )
    # A name that only begins like the preset's series is not it.
    assert presets.sampled_for(presets.preset("tgi"), "sum(tgi_request_success_x)") is None


def test_a_preset_without_the_unit_is_accepted_when_demand_and_history_are_written_out() -> None:
    doc = {
        "name": "triton",
        "node_selector": {"gpu": "h100"},
        "capacity": {"unit": "tokens_per_second", "per_node": 5000},
        "metrics": {
            "preset": "triton",
            "demand": {"value": "sum(tok)", "sampled": "timestamp(tok)"},
            "history": "sum(rate(tok[$window]))",
        },
    }
    (p,) = settings.Settings.model_validate({"pools": [doc]}).pools
    assert adapterconfig.queries(p).history == "sum(rate(tok[$window]))"
    # Measuring it needs node_served written out too.
    assert p.metrics.node_queries(p.unit) == (
        "metrics.node_served: preset triton has no tokens_per_second query (Triton's own "
        "metrics count requests, not tokens; a TensorRT-LLM backend's token metrics differ "
        "from version to version); write metrics.node_served yourself"
    )


def test_the_placeholders_a_template_may_use_are_those_render_fills_in() -> None:
    every = " ".join(f"${name}" for name in QUERY_PLACEHOLDERS)
    history = " ".join(f"${name}" for name in HISTORY_PLACEHOLDERS)
    scope = " ".join(f"${name}" for name in SCOPE_PLACEHOLDERS)
    assert metrics.render(every, "l20", ["n-1"], scope) == "n-1 l20 n-1 l20"
    assert metrics.render(history, "l20", ["n-1"], scope, window="60s") == "n-1 l20 n-1 l20 60s"
    settings.MetricsSettings(history=history, scope=scope)  # and the settings take them
    with pytest.raises(KeyError):
        metrics.render("$window", "l20", ["n-1"], scope)
    with pytest.raises(KeyError):
        metrics.render("x", "l20", ["n-1"], "$scope")


def test_every_bad_template_of_a_pool_is_a_line_of_its_own(tmp_path: Path) -> None:
    bad = {"value": "$a", "sampled": "$b"}
    lines = errors(write(tmp_path, pool(metrics={"demand": bad, "running": None})))
    assert [line.split(":")[0] for line in lines] == [
        "pools[0].metrics.demand.value='$a'",
        "pools[0].metrics.demand.sampled='$b'",
    ]


def test_strategy_may_be_given_by_name_alone() -> None:
    s = settings.Settings.model_validate(pool(strategy="watermark"))
    assert s.pools[0].strategy == settings.StrategySettings(name="watermark")


def test_loading_the_settings_loads_no_database_driver() -> None:
    """The settings name the audit store's default URL (``adapters.auditurl``) without loading
    SQLAlchemy: a command that only reads settings starts fast."""
    import subprocess
    import sys

    probe = "import sys, rebalancer.settings; print('sqlalchemy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_kueue_workloads_are_off_unless_asked_for_and_need_a_pool_that_reads_takers(
    tmp_path: Path,
) -> None:
    assert settings.load(write(tmp_path, {"pools": [POOL]}), {}).takers.kueue_workloads is False
    on = {"takers": {"kueue_workloads": True}, "pools": [POOL]}
    assert settings.load(write(tmp_path, on), {}).takers.kueue_workloads is True
    alone = {**on, "pools": [{**POOL, "lend_only_to_takers": False}]}
    assert errors(write(tmp_path, alone)) == [
        "takers={'kueue_workloads': True}: kueue_workloads is on but no pool has "
        "lend_only_to_takers: Kueue Workloads would be watched for nothing; turn it off, or a "
        "pool's lend_only_to_takers on"
    ]
    assert errors(write(tmp_path, {"takers": {"kueue_workload": True}, "pools": [POOL]})) == [
        "takers.kueue_workload=True: unknown setting; known: kueue_workloads"
    ]
    env = {"REBALANCER_TAKERS__KUEUE_WORKLOADS": "true"}
    assert settings.load(write(tmp_path, {"pools": [POOL]}), env).takers.kueue_workloads is True
