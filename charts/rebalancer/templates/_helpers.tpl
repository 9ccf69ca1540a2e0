{{/* Names and labels shared by every template. */}}

{{- define "rebalancer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rebalancer.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rebalancer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rebalancer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rebalancer.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rebalancer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* The labels of what grants others the use of the HTTP API (templates/api-access.yaml):
not the controller's own RBAC. */}}
{{- define "rebalancer.apiAccess.labels" -}}
{{ include "rebalancer.labels" . | replace "app.kubernetes.io/component: controller" "app.kubernetes.io/component: api-access" }}
{{- end -}}

{{- define "rebalancer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rebalancer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rebalancer.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The audit store URL for SQLite: a file on the data volume. */}}
{{- define "rebalancer.sqliteUrl" -}}
sqlite+aiosqlite:////var/lib/rebalancer/audit.sqlite3
{{- end -}}

{{/* Combinations the schema cannot express well, refused at render time with a reason. */}}
{{- define "rebalancer.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (ne .Values.audit.store "postgresql") -}}
{{- fail (printf "replicaCount=%d: more than one replica needs audit.store=postgresql (a SQLite file cannot be shared between pods); got audit.store=%s" (int .Values.replicaCount) .Values.audit.store) -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail (printf "replicaCount=%d: more than one replica needs leaderElection.enabled=true (two writers would fight over the same nodes)" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) .Values.config.dry_run -}}
{{- fail (printf "replicaCount=%d: a dry run writes no Lease, so it elects no leader; run one replica (every replica would audit the same decisions)" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and (eq .Values.audit.store "postgresql") (not .Values.audit.postgresql.existingSecret) -}}
{{- fail "audit.postgresql.existingSecret: required when audit.store=postgresql (the Secret holding the database URL)" -}}
{{- end -}}
{{- if not .Values.config.pools -}}
{{- fail "config.pools: empty; name at least one inference pool (name, node_selector, rps_per_node: examples/helm-values.yaml). Without one the controller has nothing to watch and refuses to start" -}}
{{- end -}}
{{- range $key := list "leader_election" "audit" "http" -}}
{{- if hasKey $.Values.config $key -}}
{{- fail (printf "config.%s: set by the chart (use the chart's leaderElection, audit, service and http values)" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.alertmanager.tokenSecret.name (eq .Values.http.authentication "kubernetes") -}}
{{- fail (printf "alertmanager.tokenSecret.name=%s: a shared token is for http.authentication none; with kubernetes, Alertmanager sends a projected service-account token (alertmanager.serviceAccount)" .Values.alertmanager.tokenSecret.name) -}}
{{- end -}}
{{- if eq (int .Values.http.healthPort) (int .Values.service.port) -}}
{{- fail (printf "http.healthPort=%d: the same as service.port; the probes have a port of their own" (int .Values.http.healthPort)) -}}
{{- end -}}
{{- end -}}

{{/* The controller's http settings, from the chart's service and http values. */}}
{{- define "rebalancer.httpSettings" -}}
host: 0.0.0.0
port: {{ int .Values.service.port }}
health_port: {{ int .Values.http.healthPort }}
authentication: {{ .Values.http.authentication }}
alertmanager_audience: {{ .Values.http.alertmanagerAudience | quote }}
{{- if .Values.http.tls.secretName }}
tls:
  cert_file: /etc/rebalancer/tls/tls.crt
  key_file: /etc/rebalancer/tls/tls.key
{{- end }}
{{- end -}}

{{/* The settings the chart sets from its other values, over .Values.config in the ConfigMap. */}}
{{- define "rebalancer.chartSettings" -}}
{{- $le := .Values.leaderElection }}
{{- $chart := dict
  "leader_election" (dict
    "enabled" $le.enabled
    "lease_name" (include "rebalancer.fullname" .)
    "lease_namespace" .Release.Namespace
    "lease_duration" $le.leaseDuration
    "renew_deadline" $le.renewDeadline
    "retry_period" $le.retryPeriod)
  "http" (include "rebalancer.httpSettings" . | fromYaml)
  "node_state_keys" (include "rebalancer.nodeStateKeysPath" .) }}
{{- if eq .Values.audit.store "sqlite" }}
{{- $_ := set $chart "audit" (dict "url" (include "rebalancer.sqliteUrl" .)) }}
{{- end }}
{{- toYaml $chart }}
{{- end -}}

{{/*
What of the settings the running controller takes only at a restart
(docs/design/live-settings.md): the chart's own settings, config's restart-only fields and, of
each pool, its name, order, queries, Alertmanager selectors and lend_only_to_takers. The pods'
checksum is of this alone, so that an upgrade that changes only live settings (a pool's limits,
paused) reaches the running controller through its ConfigMap, without a restart.
*/}}
{{- define "rebalancer.restartSettings" -}}
{{- $pools := list }}
{{- range .Values.config.pools }}
{{- $pools = append $pools (pick . "name" "metrics" "wake_on" "lend_only_to_takers") }}
{{- end }}
{{- $config := omit .Values.config "paused" "frozen" "pools" "log_level" "strategy_timeout" "lend_concurrency" "clock_skew_bound" }}
{{- toYaml (dict "chart" (include "rebalancer.chartSettings" . | fromYaml) "config" $config "pools" $pools) }}
{{- end -}}

{{/* The ServiceMonitor's own scraper: made unless monitoring.serviceMonitor.tokenSecret names one. */}}
{{- define "rebalancer.scraper" -}}
{{- printf "%s-metrics-scraper" (include "rebalancer.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rebalancer.makesScraper" -}}
{{- if and .Values.monitoring.serviceMonitor.enabled (eq .Values.http.authentication "kubernetes") (not .Values.monitoring.serviceMonitor.tokenSecret.name) -}}
true
{{- end -}}
{{- end -}}

{{/* The GPU labeler (gpuLabeler.enabled): its own names and labels, so that no selector of the
controller's (Deployment, Service, PodDisruptionBudget, NetworkPolicy) ever matches its pods. */}}
{{- define "rebalancer.gpuLabeler.name" -}}
{{- printf "%s-gpu-labeler" (include "rebalancer.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rebalancer.gpuLabeler.serviceAccountName" -}}
{{- default (include "rebalancer.gpuLabeler.name" .) .Values.gpuLabeler.serviceAccount.name -}}
{{- end -}}

{{- define "rebalancer.gpuLabeler.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-gpu-labeler" (include "rebalancer.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rebalancer.gpuLabeler.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rebalancer.gpuLabeler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: gpu-labeler
{{- end -}}

{{/* The uninstall hook (uninstall.reclaim): its own names and labels, so that the controller's
Deployment selector never counts its pod among the controller's (the hook waits for those to be
gone). */}}
{{- define "rebalancer.uninstall.name" -}}
{{- printf "%s-uninstall" (include "rebalancer.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rebalancer.uninstall.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ printf "%s-uninstall" (include "rebalancer.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: uninstall
{{- end -}}

{{/* A prometheus-operator kind this cluster must serve before the chart renders one: a missing
CRD is a refusal naming the value, not a failed install halfway. Rendering without a cluster
(helm template), pass the cluster's API versions (--api-versions monitoring.coreos.com/v1/KIND,
as Argo CD does) or set monitoring.crdCheck=false. */}}
{{- define "rebalancer.requireCRD" -}}
{{- $ctx := index . 0 -}}
{{- $kind := index . 1 -}}
{{- $value := index . 2 -}}
{{- if and $ctx.Values.monitoring.crdCheck (not ($ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind))) -}}
{{- fail (printf "%s: this cluster serves no monitoring.coreos.com/v1 %s; install the Prometheus Operator's CRDs (kube-prometheus-stack) first, or set %s=false. Rendering offline: --api-versions monitoring.coreos.com/v1/%s, or monitoring.crdCheck=false" $value $kind $value $kind) -}}
{{- end -}}
{{- end -}}

{{/* The audit store's URL from the PostgreSQL Secret (audit.store=postgresql): an env entry for
the controller, its uninstall hook and its helm test alike. */}}
{{- define "rebalancer.postgresUrlEnv" -}}
- name: REBALANCER_AUDIT__URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.audit.postgresql.existingSecret }}
      key: {{ .Values.audit.postgresql.secretKey }}
{{- end -}}

{{/*
The Secret holding the node-state keys, and where they are mounted
(docs/design/node-state-integrity.md).
*/}}
{{- define "rebalancer.nodeStateKeysSecret" -}}
{{- .Values.nodeStateKeys.existingSecret | default (printf "%s-node-state-keys" (include "rebalancer.fullname" .)) -}}
{{- end }}

{{- define "rebalancer.nodeStateKeysPath" -}}
/var/run/rebalancer/node-state-keys
{{- end }}
