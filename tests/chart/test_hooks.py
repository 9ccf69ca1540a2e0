"""The chart's hooks, as rendered. The pre-delete hook: what it runs, with which account and
grants, and that the controller's own selector never counts its pod (the hook waits for those
to be gone); it is proven on a real kube-apiserver in tests/test_uninstall.py. The helm test:
the online check, with the controller's settings and account."""

from __future__ import annotations

from typing import Any

from tests.support.chart import HOOK, Doc, of_kind, one, render

POSTGRES: dict[str, Any] = {
    "audit": {"store": "postgresql", "postgresql": {"existingSecret": "rebalancer-db"}}
}


def container(job: Doc) -> Doc:
    (c,) = job["spec"]["template"]["spec"]["containers"]
    found: Doc = c
    return found


def test_the_hook_stops_the_controller_then_takes_every_loan_back() -> None:
    installed = render()
    hook = render(hook="pre-delete")
    deployment = one(installed, "Deployment")
    job = one(hook, "Job")
    assert container(job)["args"] == [
        "reclaim",
        "--all",
        f"--stop-controller={deployment['metadata']['name']}",
        "--stop-timeout=5m",
        "--log-records",
    ]
    # The controller's account and image, the settings it runs with.
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    controller = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container(job)["image"] == controller["image"]
    assert pod["volumes"][0]["configMap"]["name"] == one(installed, "ConfigMap")["metadata"]["name"]
    # Its pod is not one of the controller's: else it would wait for itself.
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= labels.items()
    # Roles first, then the Job; all of it deleted once it succeeded.
    weights = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in hook}
    assert weights["Role"] < weights["Job"]
    assert weights["RoleBinding"] < weights["Job"]
    assert {d["metadata"]["annotations"][HOOK] for d in hook} == {"pre-delete"}


def test_the_grant_to_scale_the_controller_is_the_hook_s_only() -> None:
    name = one(render(), "Deployment")["metadata"]["name"]
    (role,) = of_kind(render(hook="pre-delete"), "Role")
    scale = [r for r in role["rules"] if "deployments/scale" in r["resources"]]
    assert scale == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": [name],
            "verbs": ["patch"],
        }
    ]
    for role in of_kind(render(), "Role"):
        assert all("deployments" not in r["resources"] for r in role["rules"])


def test_its_audit_records_go_where_it_can_write_them() -> None:
    env = {e["name"]: e for e in container(one(render(hook="pre-delete"), "Job"))["env"]}
    # SQLite: the controller's file is on a volume this pod does not mount; a scratch file,
    # and the records as JSON lines in the Job's log (--log-records).
    assert (
        env["REBALANCER_AUDIT__URL"]["value"] == "sqlite+aiosqlite:////tmp/uninstall-audit.sqlite3"
    )
    env = {e["name"]: e for e in container(one(render(POSTGRES, hook="pre-delete"), "Job"))["env"]}
    assert env["REBALANCER_AUDIT__URL"]["valueFrom"]["secretKeyRef"]["name"] == "rebalancer-db"


def test_no_hook_in_a_dry_run_or_when_turned_off() -> None:
    assert render({"config": {"dry_run": True}}, hook="pre-delete") == []
    assert render({"uninstall": {"reclaim": False}}, hook="pre-delete") == []


def test_helm_test_runs_the_online_check_with_the_controller_s_settings_and_account() -> None:
    installed = render()
    (pod,) = render(hook="test")
    assert pod["kind"] == "Pod"
    (check,) = pod["spec"]["containers"]
    assert check["args"] == ["check", "--online", "--config", "/etc/rebalancer/config.yaml"]
    deployment = one(installed, "Deployment")["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == deployment["spec"]["serviceAccountName"]
    assert check["image"] == deployment["spec"]["containers"][0]["image"]
    config = one(installed, "ConfigMap")["metadata"]["name"]
    assert pod["spec"]["volumes"][0]["configMap"]["name"] == config
    assert not deployment["metadata"]["labels"].items() <= pod["metadata"]["labels"].items()
