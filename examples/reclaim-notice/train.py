"""A training loop that answers the rebalancer's reclaim notice (docs/reclaim-notice.md).

Standard library only (Python 3.11). Each step it reads the notice file, a downward-API
projection of its pod's ``rebalancer.io/reclaim-deadline`` annotation that the kubelet keeps up
to date (empty: no notice). When a deadline appears it saves a checkpoint, tells the controller
so on its own pod (``rebalancer.io/last-checkpoint-time`` and ``rebalancer.io/reclaim-ack``, a
JSON merge patch made with the pod's ServiceAccount token), and exits 143: non-zero, so that
its Job makes the pod again rather than count the work done. SIGTERM (an eviction with no
notice) saves and exits the same way. If the API cannot be reached or refuses the patch, it
still saves and exits: a pod that has ended has answered too.

Environment (the pod's manifest, job.yaml, sets the first two from the downward API):
  POD_NAME, POD_NAMESPACE   its own pod, to patch
  NOTICE_DIR                the downward-API volume (default /etc/rebalancer): files
                            reclaim-deadline and reclaim-id
  CHECKPOINT_DIR            where checkpoints go (default /checkpoints): storage that outlives
                            the node
  STEP_SECONDS              how long a pretend step takes (default 1)
  CHECKPOINT_EVERY          steps between periodic checkpoints (default 100)
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

PREFIX = "rebalancer.io/"
NOTICE_DIR = Path(os.environ.get("NOTICE_DIR", "/etc/rebalancer"))
CHECKPOINT_DIR = Path(os.environ.get("CHECKPOINT_DIR", "/checkpoints"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "1"))
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "100"))
ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PREEMPTED = 143  # 128 + SIGTERM: retried by the Job, as a process killed by SIGTERM would be

terminated = threading.Event()  # set by SIGTERM, acted on at the end of the step


def log(message: str) -> None:
    print(f"{datetime.now(UTC).isoformat(timespec='milliseconds')} {message}", flush=True)


def notice() -> tuple[str, str]:
    """The deadline and the reclaim id, empty while there is no notice. Two small reads: cheap
    enough for every step. The kubelet swaps both files in together and the deadline is read
    first: once a deadline is seen, the id read after it is that notice's."""
    try:
        deadline = (NOTICE_DIR / "reclaim-deadline").read_text().strip()
        reclaim_id = (NOTICE_DIR / "reclaim-id").read_text().strip()
    except FileNotFoundError:  # no volume: run without notices
        return "", ""
    return deadline, reclaim_id


def load() -> int:
    """The step to start from: the last checkpoint's, or 0."""
    try:
        return int(json.loads((CHECKPOINT_DIR / "checkpoint.json").read_text())["step"])
    except FileNotFoundError:
        return 0


def save(step: int) -> str:
    """Write the checkpoint whole (a temporary file renamed), return when it was saved."""
    CHECKPOINT_DIR.mkdir(parents=True, exist_ok=True)
    part = CHECKPOINT_DIR / "checkpoint.json.part"
    part.write_text(json.dumps({"step": step}))  # a real job writes its model and optimizer
    os.replace(part, CHECKPOINT_DIR / "checkpoint.json")
    saved = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    log(f"checkpoint saved at step {step}")
    return saved


def report(annotations: dict[str, str]) -> None:
    """Set ``annotations`` on our own pod. Best effort: a failure is logged, never raised."""
    env = os.environ
    name, namespace = env.get("POD_NAME"), env.get("POD_NAMESPACE")
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not (name and namespace and host and port):
        log("not reported: not in a cluster, or POD_NAME/POD_NAMESPACE unset")
        return
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    body = json.dumps({"metadata": {"annotations": annotations}}).encode()
    try:
        token = (ACCOUNT / "token").read_text()  # read each time: the kubelet rotates it
        request = urllib.request.Request(
            f"https://{host}:{port}/api/v1/namespaces/{namespace}/pods/{name}",
            data=body,
            method="PATCH",
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/merge-patch+json",
            },
        )
        context = ssl.create_default_context(cafile=str(ACCOUNT / "ca.crt"))
        with urllib.request.urlopen(request, timeout=5, context=context):
            log(f"reported {annotations}")
    except OSError as error:  # unreachable, refused (403 without RBAC), no token mounted
        log(f"not reported ({error})")


def stop(step: int, reclaim_id: str = "") -> None:
    """Save, report, exit non-zero: reported or not, the exit answers the notice."""
    annotations = {PREFIX + "last-checkpoint-time": save(step)}
    if reclaim_id:
        annotations[PREFIX + "reclaim-ack"] = reclaim_id
    report(annotations)
    log(f"exiting {PREEMPTED}")
    sys.exit(PREEMPTED)


def on_sigterm(signum: int, frame: object) -> None:
    terminated.set()
    log("SIGTERM")


def main() -> None:
    signal.signal(signal.SIGTERM, on_sigterm)
    step = load()
    log(f"starting at step {step}")
    while True:
        time.sleep(STEP_SECONDS)  # one training step
        step += 1
        deadline, reclaim_id = notice()
        if deadline:
            log(f"reclaim notice: deadline {deadline}, reclaim id {reclaim_id or '?'}")
            stop(step, reclaim_id)
        if terminated.is_set():
            stop(step)
        if step % CHECKPOINT_EVERY == 0:
            report({PREFIX + "last-checkpoint-time": save(step)})


if __name__ == "__main__":
    main()
