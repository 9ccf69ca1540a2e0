"""What the tests share: fakes, builders, waits, and the servers and processes they start.

No test module is imported by another module; whatever two tests need lives here, once, and a
conftest only turns it into fixtures. By where a test sits in the flow:

Pure values (the core and the strategies)
- ``factories``: node views in every phase, built with the node-state codec; policies, plans.
- ``series``: Hypothesis strategies of demand histories (zeros, gaps, spikes, floods).
- ``nvidia_smi``: what nvidia-smi prints on seven real cards (with where each value comes from),
  and a fake ``nvidia-smi`` executable that prints it, fails as a broken driver does, or hangs.

The Reconciler on in-memory seams
- ``fakes``: ``Views``, ``Demand``, ``CodecActuator`` (moves nodes through the codec), ``Calls``,
  ``Lead``, ``JournalStore`` (the in-memory audit store, journalled), ``Scripted`` strategies.
- ``observers``: ``Seen``, what the reports of a Reconciler's ticks noted, tick after tick.
- ``audit_disk``: ``Disk``, a real SQLite audit store's disk made to refuse writes as a full
  one does.

The HTTP API's gate
- ``gates``: ``Grants`` (a gate from a table of tokens and grants), ``Scripted`` and
  ``Counted`` reviews, and ``session``, a client of the API's TLS port with a token.
- ``tokens``: service accounts on a real kube-apiserver, granted by ClusterRoles, with tokens
  the TokenRequest API mints (an audience asked for, or the API server's).

The API emulator over HTTP
- ``emulated``: ``running()``, an emulator per test on a manual clock, with its typed clients
  and ``Requests``, the log its request observer (``serve(on_request=...)``) fills.
- ``objects``: Kubernetes objects to add (nodes, DaemonSet and training pods, budgets) and the
  writes a test makes behind the client's back (annotate, label, a pod that finished).
- ``reads``: what a test reads back (a node's labels and taints as JSON text, its state, the pods
  on it, a ``Status`` body).
- ``pools``: the default cluster's inference pool (keys, lend spec, pod marks, a churn-friendly
  policy, busy and idle nodes) and its replicas and waiting training pods.
- ``actuation``: the actuator's kit: a recording (and crashing) writer, ``world``, ``drive``,
  the state machine's edges.

Waiting
- ``waits``: ``Pulse`` (event-driven, in process), ``until`` (polling another process),
  ``stop``, ``no_sleep``, watch-event reads.

Two servers
- ``backends``: ``Emulator`` and ``Real``, what the ``backend`` fixture gives a test: a cluster
  opened on either, ``Objects`` (the emulator's ``Store`` calls, or the same as HTTP requests to
  a real kube-apiserver, whose missing kubelet, scheduler, node lifecycle and disruption
  controllers it plays), the controller's clock, clients as each user with their request logs.

Servers and processes
- ``kube``: a real kube-apiserver with etcd (built by ``tests/kube/build.sh``), as envtest starts
  them: its own serving certificate, static tokens, RBAC.
- ``control_plane``: the real kube-scheduler, kube-controller-manager and KWOK (its Stages in
  ``tests/kube/stages``) beside a running ``kube`` server.
- ``training_cluster``: a pool of KWOK GPU nodes with inference replicas and a real Indexed Job
  as training, for the end-to-end suite on the real control plane.
- ``takers_gen``: seeded clusters of lent nodes and one pending pod each, for the differential
  suite of ``core.takers`` against kube-scheduler.
- ``kubectl``: the real kubectl (built by the same script), run against a server without
  blocking the loop that serves the emulator; ``columns`` reads its tables.
- ``prometheus``: a real Prometheus, backfilled with a trace or scraping a live target.
- ``demand_history``: a real Prometheus holding the bundled week as pool demand, with gaps, for
  ``rebalancer simulate --prometheus``.
- ``postgres``: a throwaway PostgreSQL server (``initdb``, ``pg_ctl``) for the audit store.
- ``exporter``: a fake vLLM exporter for the scraping Prometheus.
- ``processes``: the ``rebalancer`` command as a process: its environment, a cluster and
  settings for one command (``setup``), the chart's Deployment laid out locally (``as_pod``).
- ``harness``: a pool on the emulator (``harness``) or on the real control plane with real
  training Jobs (``on_plane``), an exporter, Prometheus and the controller process, for
  process tests.
- ``failing_strategy``: ``python -m tests.support.failing_strategy``, ``rebalancer`` with one
  more strategy, which raises; with ``--held`` first, started but held until told to go.
- ``rbac``: the chart's RBAC applied to the emulator, and granted against used.
- ``chart``: the Helm chart rendered by Helm's own engine.
- ``grafana``: the chart's dashboard, its targets, and Grafana's variables and macros put in.

The suite's run
- ``ordering``: the longest modules first, one at the head of each parallel worker's share.
- ``rewritten``: pytest's rewritten test modules written once before the workers start.
"""
