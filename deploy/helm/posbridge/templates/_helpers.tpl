{{/*
Names. The full name is cut at 42 characters so that every name made from
it stays a valid DNS label: "<name>-reconciler", and the StatefulSet's
revision label "<name>-<10 characters>".
*/}}
{{- define "posbridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 42 | trimSuffix "-" -}}
{{- end -}}

{{- define "posbridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "posbridge.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "posbridge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "posbridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
The pods that serve webhooks. The component keeps the reconciler's pod out
of the Services and the disruption budget.
*/}}
{{- define "posbridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "posbridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "posbridge.reconcilerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "posbridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: reconciler
{{- end -}}

{{/* The one volume of each replica, and where the config file is. */}}
{{- define "posbridge.dataDir" -}}/var/lib/posbridge{{- end -}}
{{- define "posbridge.configDir" -}}/etc/posbridge/config{{- end -}}
{{- define "posbridge.configFile" -}}{{ include "posbridge.configDir" . }}/posbridge.toml{{- end -}}

{{/*
The environment variable that overrides a config key: POSBRIDGE__ and the
key's path in capitals joined by "__"; a librdkafka property keeps its
name, dots and all, after POSBRIDGE__KAFKA__LIBRDKAFKA__.
*/}}
{{- define "posbridge.envName" -}}
{{- if hasPrefix "kafka.librdkafka." . -}}
POSBRIDGE__KAFKA__LIBRDKAFKA__{{ trimPrefix "kafka.librdkafka." . }}
{{- else -}}
POSBRIDGE__{{ . | upper | replace "." "__" }}
{{- end -}}
{{- end -}}

{{/* Where the sourcesSecret's files are mounted. */}}
{{- define "posbridge.sourcesDir" -}}
/etc/posbridge/sources
{{- end -}}

{{/* The config keys secretEnv fills, for the checks below. */}}
{{- define "posbridge.secretKeys" -}}
{{- range .Values.secretEnv }}{{ .key }}{{ "\n" }}{{ end -}}
{{- end -}}

{{- define "posbridge.backend" -}}
{{- dig "ledger" "backend" "embedded" (.Values.config | default dict) -}}
{{- end -}}

{{/*
Whether `posbridge reconciler` runs as a Deployment of its own: in the
shared shape, when the config enables the reconciler or the watchdog,
which must run in one process only.
*/}}
{{- define "posbridge.separateReconciler" -}}
{{- $c := .Values.config | default dict -}}
{{- if and (eq (include "posbridge.backend" .) "redis") (or (dig "reconcile" "enabled" false $c) (dig "watchdog" "enabled" false $c)) -}}
true
{{- end -}}
{{- end -}}

{{/*
posbridge's TOML file: .Values.config checked, completed with what the
chart decides (listeners, paths), rendered with toToml.
*/}}
{{- define "posbridge.configToml" -}}
{{- $c := deepCopy (.Values.config | default dict) -}}
{{- range $section, $key := dict "server" "listen" "admin" "listen" "ledger" "path" "spool" "path" -}}
{{- if hasKey (get $c $section | default dict) $key -}}
{{- fail (printf "config.%s.%s is set by the chart (ports.http, listenAddress, admin and the volume at %s): leave it out" $section $key (include "posbridge.dataDir" $)) -}}
{{- end -}}
{{- end -}}
{{- $backend := include "posbridge.backend" . -}}
{{- if not (has $backend (list "embedded" "redis")) -}}
{{- fail (printf "config.ledger.backend is \"embedded\" or \"redis\", not %q" $backend) -}}
{{- end -}}
{{- if and (eq $backend "embedded") (ne (int .Values.replicas) 1) -}}
{{- fail (printf "replicas is %v, but the embedded ledger is a file one process alone may hold: use replicas: 1, or config.ledger.backend: redis (the shared shape)" .Values.replicas) -}}
{{- end -}}
{{- $secretKeys := splitList "\n" (include "posbridge.secretKeys" .) -}}
{{- $sources := 0 -}}
{{- range $provider := list "receiptroller" "mekari" -}}
{{- range $name, $source := dig $provider "sources" dict $c -}}
{{- $sources = add1 $sources -}}
{{- $key := printf "%s.sources.%s" $provider $name -}}
{{- if not (kindIs "map" $source) -}}
{{- fail (printf "config.%s is a table of the source's settings ({} for the defaults)" $key) -}}
{{- end -}}
{{- if $source.secrets -}}
{{- fail (printf "config.%s.secrets would put webhook secrets in a ConfigMap: keep them in a Secret and name it under secretEnv (key: %s.secrets)" $key $key) -}}
{{- end -}}
{{- /* A source may name its secrets another way (a key such as secrets_files,
       for a posbridge that reads them from files mounted with secretFiles). */ -}}
{{- $otherWay := false -}}
{{- range $field, $_ := $source -}}
{{- if hasPrefix "secrets_" $field -}}{{- $otherWay = true -}}{{- end -}}
{{- end -}}
{{- if not (or $otherWay (has (printf "%s.secrets" $key) $secretKeys)) -}}
{{- fail (printf "source %s has no secrets: add a secretEnv entry with key: %s.secrets naming the Secret that holds them" $key $key) -}}
{{- end -}}
{{- range $field := list "token" "client_secret" -}}
{{- if hasKey ($source.api | default dict) $field -}}
{{- fail (printf "config.%s.api.%s is a credential: keep it in a Secret and name it under secretEnv (key: %s.api.%s)" $key $field $key $field) -}}
{{- end -}}
{{- end -}}
{{- /* Required by posbridge; the environment override replaces it. */ -}}
{{- $_ := set $source "secrets" list -}}
{{- end -}}
{{- end -}}
{{- if .Values.sourcesSecret -}}
{{- if hasKey $c "sources_dir" -}}
{{- fail "config.sources_dir is set by the chart when sourcesSecret names a Secret: leave it out" -}}
{{- end -}}
{{- $_ := set $c "sources_dir" (include "posbridge.sourcesDir" .) -}}
{{- else if eq $sources 0 -}}
{{- fail "no webhook source is configured: add one under config.receiptroller.sources or config.mekari.sources, or name a Secret of source files in sourcesSecret" -}}
{{- end -}}
{{- range $key := list "schema_registry.password" "schema_registry.token" "admin.token" "admin.password" -}}
{{- $parts := splitList "." $key -}}
{{- if hasKey (get $c (first $parts) | default dict) (last $parts) -}}
{{- fail (printf "config.%s is a credential: keep it in a Secret and name it under secretEnv (key: %s)" $key $key) -}}
{{- end -}}
{{- end -}}
{{- range $property, $_ := dig "kafka" "librdkafka" dict $c -}}
{{- if regexMatch "password|secret|^ssl\\.key\\.pem$|^sasl\\.oauthbearer\\.config$" $property -}}
{{- fail (printf "config.kafka.librdkafka.%q is a credential: keep it in a Secret and name it under secretEnv (key: kafka.librdkafka.%s)" $property $property) -}}
{{- end -}}
{{- end -}}
{{- if regexMatch "://[^/]*@" (dig "ledger" "redis_url" "" $c) -}}
{{- fail "config.ledger.redis_url holds credentials: keep the URL in a Secret and name it under secretEnv (key: ledger.redis_url)" -}}
{{- end -}}
{{- if and .Values.admin.enabled .Values.admin.expose (not (or (has "admin.token" $secretKeys) (has "admin.password" $secretKeys))) -}}
{{- fail "admin.expose puts the status page on the network: name admin.token (or admin.password, with config.admin.username) under secretEnv" -}}
{{- end -}}
{{- $server := get $c "server" | default dict -}}
{{- $_ := set $server "listen" (printf "%s:%d" .Values.listenAddress (int .Values.ports.http)) -}}
{{- $_ := set $c "server" $server -}}
{{- if .Values.admin.enabled -}}
{{- $admin := get $c "admin" | default dict -}}
{{- $_ := set $admin "listen" (printf "%s:%d" (ternary .Values.listenAddress "127.0.0.1" .Values.admin.expose) (int .Values.admin.port)) -}}
{{- $_ := set $c "admin" $admin -}}
{{- end -}}
{{- $ledger := get $c "ledger" | default dict -}}
{{- if eq $backend "embedded" -}}
{{- $_ := set $ledger "path" (printf "%s/ledger.redb" (include "posbridge.dataDir" .)) -}}
{{- end -}}
{{- $_ := set $c "ledger" $ledger -}}
{{- $spool := get $c "spool" | default dict -}}
{{- $_ := set $spool "path" (printf "%s/spool.redb" (include "posbridge.dataDir" .)) -}}
{{- $_ := set $c "spool" $spool -}}
{{- include "posbridge.integers" $c -}}
{{- toToml $c -}}
{{- end -}}

{{/*
Helm reads every number in values as a float, which toToml writes as one
(body_limit_bytes = 1.048576e+06). posbridge's numbers are integers: it
would round such a float, but the file is read by people too. Turns each
whole float in a table, and in its tables, into an integer, in place.
*/}}
{{- define "posbridge.integers" -}}
{{- range $key, $value := . -}}
{{- if kindIs "map" $value -}}
{{- include "posbridge.integers" $value -}}
{{- else if and (kindIs "float64" $value) (eq $value (floor $value)) -}}
{{- $_ := set $ $key (int64 $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Seconds Kubernetes waits after asking a pod to stop: the preStop sleep,
then posbridge's shutdown: server.drain_delay_ms still answering with
/readyz 503 (10000 by default, as in posbridge), then at most three times
server.shutdown_timeout_ms (10000 by default: open connections finish,
in-flight deliveries finish, the producer flushes), and 5 s to spare.
*/}}
{{- define "posbridge.terminationGracePeriodSeconds" -}}
{{- $server := dig "server" dict (.Values.config | default dict) -}}
{{- $shutdown := int64 (hasKey $server "shutdown_timeout_ms" | ternary (get $server "shutdown_timeout_ms") 10000) -}}
{{- $drain := int64 (hasKey $server "drain_delay_ms" | ternary (get $server "drain_delay_ms") 10000) -}}
{{- add (int64 .Values.preStopSleepSeconds) (div (add $drain (mul 3 $shutdown) 999) 1000) 5 -}}
{{- end -}}

{{/* The environment of every posbridge container. */}}
{{- define "posbridge.env" -}}
- name: POSBRIDGE_LOG_JSON
  value: {{ .Values.logJson | quote }}
{{- range .Values.secretEnv }}
- name: {{ include "posbridge.envName" .key }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .secretKey }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Volumes every posbridge pod has besides its data volume. */}}
{{- define "posbridge.volumes" -}}
- name: config
  configMap:
    name: {{ include "posbridge.fullname" . }}
# A writable /tmp on a read-only root: `posbridge replay-dead-letters
# --dry-run`, run with kubectl exec beside serve, plans in a scratch ledger there.
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- with .Values.sourcesSecret }}
# The sources directory: a whole-Secret mount, updated in place.
- name: sources
  secret:
    secretName: {{ . }}
{{- end }}
{{- range .Values.secretFiles }}
- name: {{ .name }}
  secret:
    secretName: {{ .secretName }}
    {{- with .items }}
    items:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- end }}
{{- end -}}

{{- define "posbridge.volumeMounts" -}}
- name: config
  mountPath: {{ include "posbridge.configDir" . }}
  readOnly: true
{{- if .Values.sourcesSecret }}
- name: sources
  mountPath: {{ include "posbridge.sourcesDir" . }}
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- range .Values.secretFiles }}
- name: {{ .name }}
  mountPath: {{ .mountPath }}
  readOnly: true
{{- end }}
{{- end -}}
