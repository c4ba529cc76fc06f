{{/*
The chart renders what router/deploy.py renders from a settings file: the settings come first
(rhumbatron.settings, written to the ConfigMap with toToml), and every object is drawn from
them, never from .Values directly, so the objects and the file the pods read cannot disagree.
*/}}

{{- define "rhumbatron.app" -}}rhumbatron{{- end -}}
{{- define "rhumbatron.configDir" -}}/etc/rhumbatron{{- end -}}
{{- define "rhumbatron.stateDir" -}}/var/lib/rhumbatron{{- end -}}
{{- define "rhumbatron.probePort" -}}9400{{- end -}}

{{/*
Settings whose values are secrets: the Secret rhumbatron-secrets carries them (as these
environment variables), never the ConfigMap.
*/}}
{{- define "rhumbatron.secretSettings" -}}
{{- toJson (dict
  "kafka_sasl_password" "RHUMBATRON_KAFKA_SASL_PASSWORD"
  "kafka_ssl_key_password" "RHUMBATRON_KAFKA_SSL_KEY_PASSWORD"
  "kafka_oauth_client_secret" "RHUMBATRON_KAFKA_OAUTH_CLIENT_SECRET"
  "redis_password" "RHUMBATRON_REDIS_PASSWORD"
  "archive_s3_access_key" "RHUMBATRON_ARCHIVE_S3_ACCESS_KEY"
  "archive_s3_secret_key" "RHUMBATRON_ARCHIVE_S3_SECRET_KEY"
  "operator_token" "RHUMBATRON_OPERATOR_TOKEN"
  "operator_read_token" "RHUMBATRON_OPERATOR_READ_TOKEN"
  "http_handler_secrets" "RHUMBATRON_HTTP_HANDLER_SECRETS"
) -}}
{{- end -}}

{{/*
Whole numbers in a map from a values file: YAML numbers reach a template as float64, which
toToml would write as 45000.0. Call with (dict "map" $m); changes $m in place, in its maps and
lists too.
*/}}
{{- define "rhumbatron.wholeNumbers" -}}
{{- $m := .map -}}
{{- range $key, $value := $m -}}
{{- if kindIs "map" $value -}}
{{- include "rhumbatron.wholeNumbers" (dict "map" $value) -}}
{{- else if kindIs "slice" $value -}}
{{- $items := dict -}}
{{- range $index, $item := $value -}}
{{- $_ := set $items (printf "%06d" $index) $item -}}
{{- end -}}
{{- include "rhumbatron.wholeNumbers" (dict "map" $items) -}}
{{- $whole := list -}}
{{- range $index, $item := $value -}}
{{- $whole = append $whole (get $items (printf "%06d" $index)) -}}
{{- end -}}
{{- $_ := set $m $key $whole -}}
{{- else if and (kindIs "float64" $value) (eq (float64 (int64 $value)) $value) -}}
{{- $_ := set $m $key (int64 $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The settings file as a map, its keys router/settings.py's fields. Call with (dict "Values"
.Values "out" $map): fills $map (include returns nothing), so numbers keep their types.
*/}}
{{- define "rhumbatron.fillSettings" -}}
{{- $v := .Values -}}
{{- $s := .out -}}
{{- $named := dict -}}
{{- $_ := set $named "env" $v.env -}}
{{- $_ := set $named "streams" (int64 $v.streams) -}}
{{- $_ := set $named "partitions" (int64 $v.partitions) -}}
{{- $_ := set $named "replication_factor" (int64 $v.replicationFactor) -}}
{{- $_ := set $named "kafka_bootstrap" $v.kafka.bootstrap -}}
{{- $_ := set $named "kafka_security_protocol" $v.kafka.securityProtocol -}}
{{- with $v.kafka.saslMechanism }}{{ $_ := set $named "kafka_sasl_mechanism" . }}{{ end -}}
{{- with $v.kafka.saslUsername }}{{ $_ := set $named "kafka_sasl_username" . }}{{ end -}}
{{- with $v.kafka.sslCaFile }}{{ $_ := set $named "kafka_ssl_ca_file" . }}{{ end -}}
{{- $_ := set $named "redis_url" $v.redis.url -}}
{{- with $v.redis.username }}{{ $_ := set $named "redis_username" . }}{{ end -}}
{{- with $v.redis.sslCaFile }}{{ $_ := set $named "redis_ssl_ca_file" . }}{{ end -}}
{{- with $v.routerOutbox }}{{ $_ := set $named "router_outbox_path" . }}{{ end -}}
{{- $_ := set $named "fleet_outboxes" (default (list) $v.outboxes) -}}
{{- $_ := set $named "archive_store" $v.archive.store -}}
{{- if eq $v.archive.store "s3" -}}
{{- with $v.archive.s3.endpoint }}{{ $_ := set $named "archive_s3_endpoint" . }}{{ end -}}
{{- with $v.archive.s3.bucket }}{{ $_ := set $named "archive_s3_bucket" . }}{{ end -}}
{{- with $v.archive.s3.region }}{{ $_ := set $named "archive_s3_region" . }}{{ end -}}
{{- end -}}
{{- $subscriptions := dict -}}
{{- range $slug, $subscription := $v.subscriptions -}}
{{- $_ := set $subscriptions $slug (int64 $subscription.processes) -}}
{{- end -}}
{{- $_ := set $named "fleet_subscriptions" $subscriptions -}}
{{- $_ := set $named "fleet_static_membership" $v.staticMembership -}}
{{- with $v.workers }}{{ $_ := set $named "fleet_workers" . }}{{ end -}}
{{- $_ := set $named "fleet_worker_processes" (int64 $v.workerProcesses) -}}
{{- with $v.pump.feed }}{{ $_ := set $named "fleet_feed" . }}{{ end -}}
{{- $_ := set $named "fleet_dead_letter_consumer" $v.deadLetterConsumer.enabled -}}
{{- $_ := set $named "fleet_analytics_rollup" $v.analyticsRollup.enabled -}}
{{- $_ := set $named "fleet_operator_server" $v.operator.enabled -}}
{{- $_ := set $named "operator_port" (int64 $v.operator.port) -}}
{{- $_ := set $named "operator_allowed_hosts" (default (list) $v.operator.allowedHosts) -}}
{{- $_ := set $named "fleet_keda" $v.keda.enabled -}}
{{- $_ := set $named "fleet_scale_lag" (int64 $v.keda.lagThreshold) -}}
{{- $_ := set $named "fleet_pod_monitor" $v.podMonitor.enabled -}}
{{- $_ := set $named "fleet_pod_cpu_request" (toString $v.resources.requests.cpu) -}}
{{- $_ := set $named "fleet_pod_memory_request" (toString $v.resources.requests.memory) -}}
{{- $_ := set $named "fleet_pod_memory_limit" (toString $v.resources.limits.memory) -}}
{{- $_ := set $named "fleet_stop_timeout_s" (float64 $v.stopTimeoutSeconds) -}}
{{- $secrets := include "rhumbatron.secretSettings" . | fromJson -}}
{{- $others := deepCopy (default (dict) $v.settings) -}}
{{- include "rhumbatron.wholeNumbers" (dict "map" $others) -}}
{{- range $key, $value := $others -}}
{{- if hasKey $named $key -}}
{{- fail (printf "settings.%s: the chart writes this setting from its own value; set that value instead of settings.%s (values.yaml names each)" $key $key) -}}
{{- end -}}
{{- if hasKey $secrets $key -}}
{{- fail (printf "settings.%s is a secret and the settings file is a ConfigMap: leave it out and put it in the Secret rhumbatron-secrets as %s" $key (get $secrets $key)) -}}
{{- end -}}
{{- $_ := set $s $key $value -}}
{{- end -}}
{{- range $key, $value := $named -}}
{{- $_ := set $s $key $value -}}
{{- end -}}
{{- end -}}

{{/*
The settings a deployment's pods cannot honour, refused as router/deploy.py refuses them. Call
with the settings map.
*/}}
{{- define "rhumbatron.checkSettings" -}}
{{- $s := . -}}
{{- $protocol := $s.kafka_security_protocol -}}
{{- $mechanism := $s.kafka_sasl_mechanism | default "" -}}
{{- if and (not (hasPrefix "SASL" $protocol)) (or $mechanism $s.kafka_sasl_username) -}}
{{- fail (printf "kafka.saslMechanism and kafka.saslUsername apply to SASL only, but kafka.securityProtocol is %s: use SASL_SSL (or SASL_PLAINTEXT), or leave them empty" $protocol) -}}
{{- end -}}
{{- if and (not (hasSuffix "SSL" $protocol)) $s.kafka_ssl_ca_file -}}
{{- fail (printf "kafka.sslCaFile applies to TLS only, but kafka.securityProtocol is %s: use SSL or SASL_SSL, or leave it empty" $protocol) -}}
{{- end -}}
{{- if and (hasPrefix "SASL" $protocol) (not $mechanism) -}}
{{- fail (printf "kafka.securityProtocol %s needs kafka.saslMechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER)" $protocol) -}}
{{- end -}}
{{- if and (has $mechanism (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512")) (not $s.kafka_sasl_username) -}}
{{- fail (printf "kafka.saslMechanism %s needs kafka.saslUsername (its password is the Secret's RHUMBATRON_KAFKA_SASL_PASSWORD)" $mechanism) -}}
{{- end -}}
{{- if and (eq $s.archive_store "local") (gt (int (get $s.fleet_subscriptions "audit-archiver" | default 0)) 0) -}}
{{- fail "archive.store: 'local' keeps the archive on a pod's own disk; a deployment archives to S3 (archive.store: s3, archive.s3.*) or not at all (none)" -}}
{{- end -}}
{{- range $s.fleet_outboxes -}}
{{- if not (or (hasPrefix "postgresql://" .) (hasPrefix "postgres://" .)) -}}
{{- fail (printf "outboxes: %q is a SQLite file, on a pod's own disk; a deployment's outboxes are PostgreSQL (postgresql://...)" .) -}}
{{- end -}}
{{- if contains ":" (urlParse .).userinfo -}}
{{- fail "outboxes: an outbox URL carries its password into the pods' command lines; leave it out and keep it in the Secret rhumbatron-secrets as PGPASSWORD" -}}
{{- end -}}
{{- end -}}
{{- $most := mul $s.streams $s.partitions -}}
{{- range $slug, $count := $s.fleet_subscriptions -}}
{{- if or (lt (int $count) 0) (gt (int $count) (int $most)) -}}
{{- fail (printf "subscriptions.%s.processes: %d: must be 0 to %d (streams x partitions, its partitions; a process past them would own none)" $slug (int $count) (int $most)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The fleet's members, grouped into workloads as router/deploy.py groups router/fleet.py's plan:
the members sharing a command line are the replicas of one workload. Returns a JSON list of
{name, args, replicas, subscription}, in the order the members start: the publishers, the
pump, the subscriptions, the workers, the dead-letter consumer, the rollup, the server.
*/}}
{{- define "rhumbatron.workloads" -}}
{{- $s := . -}}
{{- $out := list -}}
{{- range $index, $outbox := uniq $s.fleet_outboxes -}}
{{- $out = append $out (dict "name" (printf "publisher-%d" (add1 $index)) "args" (list "publish" "--outbox" $outbox) "replicas" 1 "subscription" "") -}}
{{- end -}}
{{- with $s.fleet_feed -}}
{{- $out = append $out (dict "name" "pump" "args" (list "pump" "--feed" .) "replicas" 1 "subscription" "") -}}
{{- end -}}
{{- range $slug, $count := $s.fleet_subscriptions -}}
{{- if gt (int $count) 0 -}}
{{- $out = append $out (dict "name" $slug "args" (list "consume" "--subscription" $slug) "replicas" (int $count) "subscription" $slug) -}}
{{- end -}}
{{- end -}}
{{- $processes := int $s.fleet_worker_processes -}}
{{- range $queue, $target := ($s.fleet_workers | default dict) -}}
{{- $args := list "worker" "--queue" $queue -}}
{{- if or (hasPrefix "http://" $target) (hasPrefix "https://" $target) -}}
{{- $args = concat $args (list "--http" $target) -}}
{{- else -}}
{{- $args = concat $args (list "--handler" $target) -}}
{{- end -}}
{{- $name := printf "worker-%s" $queue -}}
{{- if eq $processes 1 -}}
{{- $name = printf "worker-%s-1" $queue -}}
{{- end -}}
{{- $out = append $out (dict "name" $name "args" $args "replicas" $processes "subscription" "") -}}
{{- end -}}
{{- if $s.fleet_dead_letter_consumer -}}
{{- $out = append $out (dict "name" "dead-letter-consumer" "args" (list "dead-letter-consumer") "replicas" 1 "subscription" "") -}}
{{- end -}}
{{- if $s.fleet_analytics_rollup -}}
{{- $out = append $out (dict "name" "analytics-rollup" "args" (list "analytics-rollup") "replicas" 1 "subscription" "") -}}
{{- end -}}
{{- if $s.fleet_operator_server -}}
{{- $out = append $out (dict "name" "operator-server" "args" (list "serve" "--allow-remote") "replicas" 1 "subscription" "") -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- define "rhumbatron.labels" -}}
app.kubernetes.io/name: {{ include "rhumbatron.app" . }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{/* A probe on the metrics port. Call with (dict "path" "initial" "period" "failures"). */}}
{{- define "rhumbatron.probe" -}}
httpGet:
  path: {{ .path }}
  port: probes
initialDelaySeconds: {{ .initial }}
periodSeconds: {{ .period }}
failureThreshold: {{ .failures }}
timeoutSeconds: 3
{{- end -}}

{{/*
A workload's one container. Call with (dict "s" $settings "w" $workload "static" bool "image"
$image "pullPolicy" $policy "namespace" $ns).
*/}}
{{- define "rhumbatron.container" -}}
{{- $s := .s -}}
{{- $w := .w -}}
{{- $serve := eq (first $w.args) "serve" -}}
{{- $podName := dict "fieldRef" (dict "fieldPath" "metadata.name") -}}
name: {{ $w.name }}
image: {{ .image | quote }}
{{- with .pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
args: {{ toJson $w.args }}
env:
  - name: RHUMBATRON_CONFIG
    value: {{ printf "%s/config.toml" (include "rhumbatron.configDir" .) | quote }}
  - name: RHUMBATRON_STATE_DIR
    value: {{ include "rhumbatron.stateDir" . | quote }}
  - name: RHUMBATRON_METRICS_HOST
    value: "0.0.0.0"
  - name: RHUMBATRON_METRICS_PORT
    value: {{ include "rhumbatron.probePort" . | quote }}
  {{- /* The pod's name names the process in its group (client.id) and, in a StatefulSet, is
  its stable static member id: a restarted pod keeps its partitions. */}}
  - name: RHUMBATRON_PROCESS_NAME
    valueFrom: {{ toJson $podName }}
  {{- if .static }}
  - name: RHUMBATRON_GROUP_INSTANCE_ID
    valueFrom: {{ toJson $podName }}
  {{- end }}
  {{- if and (eq $w.subscription "causal-router") (has $s.router_outbox_path $s.fleet_outboxes) }}
  - name: RHUMBATRON_ROUTER_PUBLISH_OUTBOX
    value: "false"
  {{- end }}
  {{- if $serve }}
  - name: RHUMBATRON_OPERATOR_HOST
    value: "0.0.0.0"
  {{- $ns := .namespace }}
  {{- $own := list "operator-server" (printf "operator-server.%s" $ns) (printf "operator-server.%s.svc" $ns) (printf "operator-server.%s.svc.cluster.local" $ns) "localhost" "127.0.0.1" }}
  - name: RHUMBATRON_OPERATOR_ALLOWED_HOSTS
    value: {{ concat $s.operator_allowed_hosts $own | uniq | toJson | quote }}
  {{- end }}
envFrom:
  - secretRef:
      name: {{ include "rhumbatron.app" . }}-secrets
      optional: true
ports:
  - name: probes
    containerPort: {{ include "rhumbatron.probePort" . }}
  {{- if $serve }}
  - name: http
    containerPort: {{ $s.operator_port }}
  {{- end }}
{{- /* The rollup starts slowest: its faust worker joins its group and recovers its tables
first. */}}
livenessProbe:
  {{- include "rhumbatron.probe" (dict "path" "/healthz" "initial" (ternary 30 10 (eq (first $w.args) "analytics-rollup")) "period" 10 "failures" 3) | nindent 2 }}
readinessProbe:
  {{- include "rhumbatron.probe" (dict "path" "/readyz" "initial" 5 "period" 5 "failures" 2) | nindent 2 }}
resources:
  requests:
    cpu: {{ $s.fleet_pod_cpu_request | quote }}
    memory: {{ $s.fleet_pod_memory_request | quote }}
  limits:
    memory: {{ $s.fleet_pod_memory_limit | quote }}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
volumeMounts:
  - name: config
    mountPath: {{ include "rhumbatron.configDir" . }}
    readOnly: true
  - name: tls
    mountPath: {{ include "rhumbatron.configDir" . }}/tls
    readOnly: true
  - name: state
    mountPath: {{ include "rhumbatron.stateDir" . }}
  - name: tmp
    mountPath: /tmp
{{- end -}}
