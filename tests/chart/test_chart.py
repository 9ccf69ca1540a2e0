"""The Helm chart, rendered by Helm's own engine: combinations, lint, schema, manifests, config.

Every combination the chart documents renders, lints clean in strict mode, and each object it
renders validates in strict mode against the Kubernetes OpenAPI schemas of 1.28 (the oldest
supported, ``kubeVersion`` in Chart.yaml) and 1.37 (``kubernetes-validate``). The settings file
the ConfigMap carries is loaded by the controller's own loader, so a chart value that the
controller would refuse at start-up fails here. Bad values are refused with a message naming the
field, by the values schema or by a template ``fail``.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from rebalancer import settings
from tests.support.chart import (
    CHART,
    POOL,
    Doc,
    hooks_and_install,
    of_kind,
    one,
    render,
    rendered,
    with_a_pool,
)
from tests.support.rbac import rbac_of

ROOT = CHART.parents[1]
KUBE_VERSIONS = ("1.28.0", "1.37.0")
CRD_GROUPS = ("monitoring.coreos.com/",)  # not Kubernetes' own kinds: tested in test_monitoring
# Kinds newer than the oldest supported version: the chart renders them only on a cluster that
# has them (the GPU labeler's admission policy needs 1.30, and the chart refuses older ones).
SINCE = {"ValidatingAdmissionPolicy": (1, 30), "ValidatingAdmissionPolicyBinding": (1, 30)}

POSTGRES: dict[str, Any] = {
    "replicaCount": 2,
    "audit": {"store": "postgresql", "postgresql": {"existingSecret": "rebalancer-db"}},
}
MONITORING: dict[str, Any] = {
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}


def example_pools() -> list[dict[str, Any]]:
    """The pools of examples/config.yaml: the documented example, as a user would pass them."""
    data = yaml.safe_load((ROOT / "examples" / "config.yaml").read_text())
    pools: list[dict[str, Any]] = data["pools"]
    return pools


_COMBINATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "postgresql-two-replicas": POSTGRES,
    "monitoring": MONITORING,
    "monitoring-postgresql": {**POSTGRES, **MONITORING},
    "example-values": yaml.safe_load((ROOT / "examples" / "helm-values.yaml").read_text()),
    "custom-pools": {
        "config": {
            "pools": example_pools(),
            "tick_interval": "15s",
            "log_level": "DEBUG",
            "cluster_name": "prod-eu-1",
        },
        "image": {"repository": "registry.example.com/rebalancer", "tag": "0.1.0-rc1"},
    },
    "dry-run": {"config": {"dry_run": True, "pools": example_pools()}},
    "gpu-labeler": {
        "gpuLabeler": {"enabled": True, "nodeSelector": {"nvidia.com/gpu.present": "true"}}
    },
    "minimal": {
        "serviceAccount": {"create": False, "name": "existing"},
        "rbac": {"create": False},
        "networkPolicy": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
        "leaderElection": {"enabled": False},
        "audit": {"sqlite": {"persistence": {"enabled": False}}},
    },
    "tls-from-a-secret": {
        **MONITORING,
        "http": {"tls": {"secretName": "rebalancer-tls"}},
        "alertmanager": {"serviceAccount": {"name": "alertmanager-main"}},
    },
    "host-network": {"hostNetwork": True},
    # docs/prometheus.md's recipes that add to the pod: a sidecar, a Secret's files (the others
    # change config alone: tests/test_settings_prometheus.py loads each).
    **{
        f"prometheus-{stem}": yaml.safe_load(
            (ROOT / "examples" / "prometheus" / f"{stem}.yaml").read_text()
        )
        for stem in ("amazon-managed", "mimir")
    },
    "behind-a-proxy": {
        "http": {"authentication": "none"},
        "alertmanager": {"tokenSecret": {"name": "rebalancer-alertmanager"}},
    },
}
# Each with a pool: the chart refuses an install that names none.
COMBINATIONS = {name: with_a_pool(values) for name, values in _COMBINATIONS.items()}


@pytest.fixture(scope="module")
def renders() -> dict[str, list[Doc]]:
    """Every object of each combination, its hooks' too."""
    return {name: hooks_and_install(values) for name, values in COMBINATIONS.items()}


def settings_text(docs: list[Doc]) -> str:
    """The settings file of the controller's ConfigMap (the dashboard has a ConfigMap too)."""
    (text,) = [
        d["data"]["config.yaml"] for d in of_kind(docs, "ConfigMap") if "config.yaml" in d["data"]
    ]
    return str(text)


def config_of(docs: list[Doc]) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(settings_text(docs))
    return loaded


def container(docs: list[Doc]) -> dict[str, Any]:
    """The controller's container (a pod may have sidecars: ``extraContainers``)."""
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (only,) = [c for c in pod["containers"] if c["name"] == "controller"]
    c: dict[str, Any] = only
    return c


def env_of(docs: list[Doc]) -> dict[str, Any]:
    return {e["name"]: e for e in container(docs)["env"]}


# ---------------------------------------------------------------------------------------------
# Render, lint, validate


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_every_combination_lints_clean_in_strict_mode(name: str) -> None:
    report = helm_python.lint(CHART, COMBINATIONS[name], strict=True, namespace="rebalancer")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert not report["errors"], report
    assert not problems, problems


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_every_manifest_validates_strictly_against_kubernetes(
    renders: dict[str, list[Doc]], name: str, version: str
) -> None:
    checked = 0
    for doc in renders[name]:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            continue
        if tuple(int(p) for p in version.split(".")[:2]) < SINCE.get(doc["kind"], (0, 0)):
            continue
        label = f"{doc['kind']}/{doc['metadata']['name']}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {label} is invalid for Kubernetes {version}: {exc.message}")
        checked += 1
    assert checked >= 3  # ConfigMap, Deployment and Service at the least


def test_strict_validation_would_catch_a_misspelt_field() -> None:
    """The check above can fail: an unknown field in a rendered object is refused."""
    deployment = one(render(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.37.0", strict=True)


def test_the_pod_joins_the_node_s_network_only_when_asked(renders: dict[str, list[Doc]]) -> None:
    """In the node's network, the cluster's DNS is still the pod's (ClusterFirstWithHostNet)."""
    pod = one(renders["host-network"], "Deployment")["spec"]["template"]["spec"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    default = one(renders["defaults"], "Deployment")["spec"]["template"]["spec"]
    assert "hostNetwork" not in default
    assert "dnsPolicy" not in default


def test_no_service_links_reach_the_controller(renders: dict[str, list[Doc]]) -> None:
    """The kubelet's variables for the chart's own Service (REBALANCER_SERVICE_HOST...) would
    read as unknown settings, and each command refuses to start on them (seen on a real kubelet,
    tests/kubeapi/test_in_cluster.py)."""
    pods = [
        d["spec"]["template"]["spec"]
        for docs in renders.values()
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet", "Job")
    ]
    assert {"Deployment", "DaemonSet", "Job"} <= {
        d["kind"] for docs in renders.values() for d in docs
    }  # the controller, the GPU labeler, the uninstall hook: each runs the image
    assert all(pod["enableServiceLinks"] is False for pod in pods)


def test_the_kinds_rendered_by_default(renders: dict[str, list[Doc]]) -> None:
    kinds = sorted(d["kind"] for d in renders["defaults"])
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRole",  # who may get /metrics, read the audit API, post alerts (api-access)
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Job",  # the uninstall hook, with its Role and RoleBinding
            "NetworkPolicy",
            "PersistentVolumeClaim",
            "Pod",  # helm test: rebalancer check --online
            "PodDisruptionBudget",
            "Role",
            "Role",
            "Role",
            "Role",  # the Events about the controller's own Pod (its settings reloaded)
            "RoleBinding",
            "RoleBinding",
            "RoleBinding",
            "RoleBinding",
            "Secret",  # the key node state is signed with
            "Service",
            "ServiceAccount",
        ]
    )
    (secret,) = of_kind(renders["defaults"], "Secret")
    assert secret["metadata"]["name"] == "rebalancer-node-state-keys"


def test_the_node_state_key_is_a_random_secret_mounted_as_files_into_every_pod_that_writes() -> (
    None
):
    """docs/design/node-state-integrity.md: a key of 64 random characters, made at install
    (``lookup`` keeps it across upgrades), mounted read-only, named in the settings; the
    controller and the uninstall hook (which takes every node back) sign with it, and no
    Role grants a right to read Secrets for it."""
    docs = hooks_and_install()
    (secret,) = of_kind(docs, "Secret")
    current = base64.b64decode(secret["data"]["current"])
    assert len(current) == 64
    assert current.isalnum()
    assert secret["data"]["previous"] == ""
    path = "/var/run/rebalancer/node-state-keys"
    config = yaml.safe_load(one(render(), "ConfigMap")["data"]["config.yaml"])
    assert config["node_state_keys"] == path
    for pod in (one(render(), "Deployment"), one(render(hook="pre-delete"), "Job")):
        spec = pod["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "node-state-keys"]
        assert volume["secret"]["secretName"] == "rebalancer-node-state-keys"
        (mount,) = [
            m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "node-state-keys"
        ]
        assert (mount["mountPath"], mount["readOnly"]) == (path, True)
    for role in (*of_kind(docs, "Role"), *of_kind(docs, "ClusterRole")):
        for rule in role.get("rules") or ():
            assert "secrets" not in rule.get("resources", ()), role["metadata"]["name"]


def test_a_named_secret_replaces_the_charts_node_state_key() -> None:
    docs = hooks_and_install({"nodeStateKeys": {"existingSecret": "my-keys"}})
    assert not list(of_kind(docs, "Secret"))
    spec = one(render({"nodeStateKeys": {"existingSecret": "my-keys"}}), "Deployment")
    volumes = spec["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "node-state-keys",
        "secret": {"secretName": "my-keys", "defaultMode": 0o440},
    } in volumes


def test_the_files_prometheus_is_reached_with_are_a_secret_mounted_read_only() -> None:
    """docs/prometheus.md: config.prometheus names files; prometheusAuth mounts the Secret that
    holds them where the recipe says, and nothing is mounted without one."""
    values = yaml.safe_load((ROOT / "examples" / "prometheus" / "mimir.yaml").read_text())
    docs = render(values)
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {
        "name": "prometheus-auth",
        "secret": {"secretName": "rebalancer-prometheus", "defaultMode": 0o440},
    } in spec["volumes"]
    (mount,) = [m for m in container(docs)["volumeMounts"] if m["name"] == "prometheus-auth"]
    assert (mount["mountPath"], mount["readOnly"]) == ("/etc/rebalancer/prometheus", True)
    prometheus = config_of(docs)["prometheus"]
    for named in (prometheus["basic_auth"]["password_file"], prometheus["tls"]["ca_file"]):
        assert named.startswith(mount["mountPath"] + "/")
    default = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert not [v for v in default["volumes"] if v["name"] == "prometheus-auth"]


def test_a_sidecar_runs_beside_the_controller_and_is_where_it_sends_its_queries() -> None:
    values = yaml.safe_load((ROOT / "examples" / "prometheus" / "amazon-managed.yaml").read_text())
    docs = render(values)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["controller", "sigv4-proxy"]
    (sidecar,) = [c for c in pod["containers"] if c["name"] == "sigv4-proxy"]
    assert "--port=127.0.0.1:8005" in sidecar["args"]
    assert config_of(docs)["prometheus"]["url"].startswith("http://127.0.0.1:8005/")
    volumes = {"extraVolumes": [{"name": "extra", "emptyDir": {}}]}
    mounts = {"extraVolumeMounts": [{"name": "extra", "mountPath": "/var/run/extra"}]}
    spec = one(render({**volumes, **mounts}), "Deployment")["spec"]["template"]["spec"]
    assert {"name": "extra", "emptyDir": {}} in spec["volumes"]
    assert {"name": "extra", "mountPath": "/var/run/extra"} in spec["containers"][0]["volumeMounts"]


# ---------------------------------------------------------------------------------------------
# The settings file the controller reads


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_the_configmap_is_a_settings_file_the_controller_accepts(
    renders: dict[str, list[Doc]], name: str, tmp_path: Path
) -> None:
    docs = renders[name]
    path = tmp_path / "config.yaml"
    path.write_text(settings_text(docs))
    env = {k: "postgresql+asyncpg://u:p@db:5432/audit" for k in env_of(docs) if "AUDIT" in k}
    loaded = settings.load(path, env=env)
    values = COMBINATIONS[name]
    assert len(loaded.pools) == len(values.get("config", {}).get("pools", []))
    assert loaded.dry_run is bool(values.get("config", {}).get("dry_run", False))
    ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    assert (loaded.http.port, loaded.http.health_port) == (ports["https"], ports["health"])
    assert loaded.http.authentication == values.get("http", {}).get("authentication", "kubernetes")
    assert loaded.cluster_name == values.get("config", {}).get("cluster_name", "default")


def test_every_setting_the_chart_does_not_set_itself_may_be_given_under_config() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    accepted = set(schema["properties"]["config"]["properties"])
    own = {"leader_election", "audit", "http"}  # the chart sets these from its own values
    assert accepted == set(settings.Settings.model_fields) - own


def test_custom_pools_arrive_in_the_settings_as_given(renders: dict[str, list[Doc]]) -> None:
    config = config_of(renders["custom-pools"])
    assert config["pools"] == example_pools()
    assert config["tick_interval"] == "15s"
    # The example values file carries the same pools as the example settings file.
    assert config_of(renders["example-values"])["pools"] == example_pools()


def test_a_pool_s_slo_means_in_the_chart_what_it_means_in_the_settings(tmp_path: Path) -> None:
    """Left out or null: the default budget; ``none``: no budget; a mapping: that budget. The
    schema lets each through and Helm passes null on, for the controller to read."""
    pools = [
        {**POOL, "name": "left-out"},
        {**POOL, "name": "null", "slo": None},
        {**POOL, "name": "off", "slo": "none"},
        {**POOL, "name": "minutes", "slo": {"max_breach_minutes": 30, "window": "24h"}},
    ]
    path = tmp_path / "config.yaml"
    path.write_text(settings_text(render({"config": {"pools": pools}})))
    loaded = {p.name: p.slo for p in settings.load(path, env={}).pools}
    assert loaded == {
        "left-out": settings.DEFAULT_SLO,
        "null": settings.DEFAULT_SLO,
        "off": None,
        "minutes": settings.SloSettings(max_breach_minutes=30, window=timedelta(days=1)),
    }


def test_the_lease_the_controller_uses_is_the_one_its_role_may_renew() -> None:
    docs = render(COMBINATIONS["defaults"])  # the install's objects: the hooks' are not there
    election = config_of(docs)["leader_election"]
    lease_roles = [
        r
        for r in of_kind(docs, "Role")
        if r["metadata"]["namespace"] == "rebalancer"
        and any("leases" in rule["resources"] for rule in r["rules"])
    ]
    (role,) = lease_roles
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [election["lease_name"]],
            "verbs": ["get", "update"],
        }
    ]
    assert election["lease_namespace"] == "rebalancer"
    lease_ns = env_of(docs)["REBALANCER_LEADER_ELECTION__LEASE_NAMESPACE"]
    assert lease_ns["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env_of(docs)["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


# ---------------------------------------------------------------------------------------------
# The pod


def test_the_pod_runs_locked_down(renders: dict[str, list[Doc]]) -> None:
    for name, docs in renders.items():
        pod = one(docs, "Deployment")["spec"]["template"]["spec"]
        c = container(docs)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["capabilities"] == {"drop": ["ALL"]}, name
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), name
        assert "memory" in c["resources"]["limits"], name
        # The probes on their own plain port: the kubelet sends no token.
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}, name
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}, name
        # Every path it writes is a volume: /tmp, and the SQLite directory when there is one.
        writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
        assert "/tmp" in writable, name


def test_sqlite_gets_a_kept_volume_and_one_pod_at_a_time(renders: dict[str, list[Doc]]) -> None:
    docs = renders["defaults"]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    claim = one(docs, "PersistentVolumeClaim")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert config_of(docs)["audit"]["url"].startswith("sqlite+aiosqlite:////var/lib/rebalancer/")
    mounts = {m["mountPath"] for m in container(docs)["volumeMounts"]}
    assert "/var/lib/rebalancer" in mounts
    # Persistence off: an emptyDir, no claim.
    minimal = renders["minimal"]
    assert not list(of_kind(minimal, "PersistentVolumeClaim"))
    data = one(minimal, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "data", "emptyDir": {}} in data


def test_postgresql_reads_its_url_from_a_secret_and_rolls(renders: dict[str, list[Doc]]) -> None:
    docs = renders["postgresql-two-replicas"]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    url = env_of(docs)["REBALANCER_AUDIT__URL"]["valueFrom"]["secretKeyRef"]
    assert url == {"name": "rebalancer-db", "key": "url"}
    assert "audit" not in config_of(docs)  # no URL, no password, in the ConfigMap
    assert not list(of_kind(docs, "PersistentVolumeClaim"))
    egress = one(docs, "NetworkPolicy")["spec"]["egress"]
    assert {"port": 5432, "protocol": "TCP"} in [p for rule in egress for p in rule["ports"]]
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    single = one(renders["defaults"], "Deployment")["spec"]["template"]["spec"]
    assert "topologySpreadConstraints" not in single


def test_a_restart_only_change_rolls_the_pods_and_a_live_one_does_not() -> None:
    """docs/design/live-settings.md: what the running controller reads again from its
    ConfigMap leaves the pods as they are; what it takes only at a restart rolls them."""

    def checksum(values: Mapping[str, Any]) -> str:
        pod = one(render(values), "Deployment")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/config"])

    def pool(**fields: Any) -> dict[str, Any]:
        return {"config": {"pools": [{**POOL, **fields}]}}

    base = checksum({})
    assert base == checksum({"podLabels": {"team": "ml"}})
    live: list[dict[str, Any]] = [
        {"config": {"paused": True}},
        pool(limits={"min_serving": 5}),
        pool(window="Mon-Fri 22:00-06:00", strategy="reactive"),
    ]
    assert {checksum(v) for v in live} == {base}
    restart: list[dict[str, Any]] = [
        {"config": {"tick_interval": "10s"}},
        {"leaderElection": {"leaseDuration": "30s"}},
        {"config": {"pools": [POOL, {**POOL, "name": "h100"}]}},
        pool(lend_only_to_takers=False),
    ]
    assert base not in {checksum(v) for v in restart}


def test_the_network_policy_lets_in_only_the_api_port(renders: dict[str, list[Doc]]) -> None:
    policy = one(renders["defaults"], "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    # Only from the monitoring namespace: no other pod may post alerts that take nodes back.
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    assert policy["ingress"] == [
        {
            "ports": [{"port": "https", "protocol": "TCP"}],
            "from": [{"namespaceSelector": {"matchLabels": monitoring}}],
        }
    ]
    ports = [p["port"] for rule in policy["egress"] for p in rule["ports"]]
    assert ports == [53, 53, 443, 6443, 9090]
    assert not list(of_kind(renders["minimal"], "NetworkPolicy"))


def test_dry_run_grants_no_write_on_nodes_or_pods(renders: dict[str, list[Doc]]) -> None:
    rules = one(rbac_of(renders["dry-run"]), "ClusterRole")["rules"]
    verbs = {(r["resources"][0], v) for r in rules for v in r["verbs"]}
    # A review is a question, stored nowhere: a dry run still serves its HTTP API, closed.
    assert verbs == {("nodes", "get"), ("nodes", "list"), ("nodes", "watch")} | {
        ("pods", "list"),
        ("pods", "watch"),
        ("tokenreviews", "create"),
        ("subjectaccessreviews", "create"),
    }
    assert config_of(renders["dry-run"])["dry_run"] is True


def test_notes_say_how_to_check_on_it_in_its_mode() -> None:
    reclaim = "exec deploy/rebalancer -- rebalancer reclaim --all"
    notes = rendered()["rebalancer/templates/NOTES.txt"]
    assert "get lease rebalancer" in notes
    assert "DRY RUN" not in notes
    assert reclaim in notes
    # A dry run takes no Lease and lends nothing, and its role may not write a node: the notes
    # send no one to look for a Lease or to reclaim through it.
    notes = rendered(COMBINATIONS["dry-run"])["rebalancer/templates/NOTES.txt"]
    assert "DRY RUN" in notes
    assert "get lease" not in notes
    assert reclaim not in notes
    assert "rollout status deployment/rebalancer" in notes
    # A token is made in the namespace of its service account, which may not be the current one.
    assert "$(kubectl -n <its-namespace> create token " in notes


# ---------------------------------------------------------------------------------------------
# Bad values


BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"replicaCount": 2}, "/audit/store"),
    ({"replicaCount": 0}, "/replicaCount"),
    ({"replicaCont": 2}, "'replicaCont' not allowed"),
    ({"config": {"pools": [{"name": "l20"}]}}, "missing property 'node_selector'"),
    ({"config": {"pools": [{"name": "l20", "node_selector": {"a": "b"}}]}}, "'capacity'"),
    (
        {"config": {"pools": [{**POOL, "capacity": {"unit": "tokens", "per_node": 1}}]}},
        "/pools/0/capacity/unit",
    ),
    ({"config": {"pools": [{"name": "l20", "node_selector": {}, "rps_per_node": 4}]}}, "/0/node"),
    ({"config": {"pools": [{**POOL, "slo": "off"}]}}, "/config/pools/0/slo"),
    ({"config": {"pools": [{**POOL, "slo": "None"}]}}, "/config/pools/0/slo"),
    ({"config": {"pools": [{**POOL, "slo": {"window": "24h"}}]}}, "/config/pools/0/slo"),
    ({"config": {"audit": {"url": "sqlite://"}}}, "'audit' not allowed"),
    ({"config": {"tick_interval": "soon"}}, "/config/tick_interval"),
    ({"config": {"cluster_name": "Prod_EU"}}, "/config/cluster_name"),
    ({"config": {"cluster_name": "c" * 64}}, "/config/cluster_name"),
    # No pool: the schema lets it through (helm lint lints the defaults), the template refuses.
    ({"config": {"pools": []}}, "config.pools: empty; name at least one inference pool"),
    # What the settings model says, generated into the schema (rebalancer/schema.py).
    ({"config": {"pools": [{**POOL, "window": "Mon-Fry 22:00-06:00"}]}}, "/pools/0/window"),
    ({"config": {"pools": [{**POOL, "limits": {"queue_limt": 5}}]}}, "'queue_limt' not allowed"),
    ({"config": {"pools": [{**POOL, "limits": {"warmup": "5d"}}]}}, "/limits/warmup"),
    ({"config": {"pools": [{**POOL, "zone": "Europe Berlin"}]}}, "/pools/0/zone"),
    ({"config": {"pools": [{**POOL, "serving_taints": ["gpu=yes"]}]}}, "/serving_taints/0"),
    (
        {"config": {"pools": [{**POOL, "strategy": {"name": "peak", "params": {"windw": 5}}}]}},
        "'windw' not allowed",
    ),
    ({"config": {"prometheus": {"url": "http://p:9090", "timout": "5s"}}}, "'timout' not allowed"),
    ({"audit": {"store": "mysql"}}, "/audit/store"),
    ({"audit": {"store": "postgresql"}}, "/audit/postgresql/existingSecret"),
    ({"securityContext": {"readOnlyRootFilesystem": False}}, "/securityContext"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"service": {"port": 70000}}, "/service/port"),
    ({"http": {"authentication": "anonymous"}}, "/http/authentication"),
    ({"http": {"tls": {"secret": "x"}}}, "'secret' not allowed"),
    ({"monitoring": {"serviceMonitor": {"interval": "30 s"}}}, "/serviceMonitor/interval"),
    ({"monitoring": {"dashbord": {"enabled": True}}}, "'dashbord' not allowed"),
]


@pytest.mark.parametrize(("values", "names"), BAD_VALUES)
def test_bad_values_are_refused_naming_the_field(values: dict[str, Any], names: str) -> None:
    with pytest.raises(helm_python.HelmError) as caught:
        render(values)
    assert names in str(caught.value)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"replicaCount": 2}, "more than one replica needs audit.store=postgresql"),
        ({**POSTGRES, "leaderElection": {"enabled": False}}, "needs leaderElection.enabled"),
        ({"audit": {"store": "postgresql"}}, "audit.postgresql.existingSecret: required"),
        ({"config": {"http": {"port": 1}}}, "config.http: set by the chart"),
        (
            {"alertmanager": {"tokenSecret": {"name": "shared"}}},
            "alertmanager.tokenSecret.name=shared: a shared token is for http.authentication none",
        ),
        ({"http": {"healthPort": 8443}}, "http.healthPort=8443: the same as service.port"),
        ({"config": {"pools": []}}, "config.pools: empty; name at least one inference pool"),
    ],
)
def test_without_the_schema_the_templates_still_refuse(
    values: dict[str, Any], says: str, tmp_path: Path
) -> None:
    """``helm install --skip-schema-validation`` meets the same refusals, from the templates."""
    copy = tmp_path / "rebalancer"
    shutil.copytree(CHART, copy)
    (copy / "values.schema.json").unlink()
    with helm_python.Chart.load(copy) as chart, pytest.raises(helm_python.HelmError) as caught:
        chart.render(with_a_pool(values), name="rebalancer", namespace="rebalancer")
    assert says in str(caught.value)


# ---------------------------------------------------------------------------------------------
# The chart README lists every value


def leaf_paths(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.extend(leaf_paths(value, path + "."))
        else:
            out.append(path)
    return out


def test_the_chart_readme_lists_every_value_and_only_real_ones() -> None:
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.MULTILINE))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    paths = leaf_paths(values)
    # A value is listed by its own row or by a row for the object it sits in.
    missing = [p for p in paths if not any(p == d or p.startswith(d + ".") for d in documented)]
    assert not missing, f"values not in charts/rebalancer/README.md: {missing}"
    stale = [d for d in documented if not any(p == d or p.startswith(d + ".") for p in paths)]
    assert not stale, f"README rows for values that do not exist: {stale}"
