{{/* Names and labels. */}}
{{- define "pegad.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pegad.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pegad.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pegad.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pegad.labels" -}}
{{ include "pegad.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pegad.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Where the container finds things. */}}
{{- define "pegad.configDir" -}}/etc/pegad{{- end -}}
{{- define "pegad.tlsDir" -}}/etc/pegad/tls{{- end -}}
{{- define "pegad.socketPath" -}}{{ .Values.socket.hostDir }}/{{ .Values.socket.file }}{{- end -}}

{{/* pool-hugepages for hugepages.size. */}}
{{- define "pegad.poolHugePages" -}}
{{- if eq .Values.hugepages.size "2Mi" -}}2M
{{- else if eq .Values.hugepages.size "1Gi" -}}1G
{{- else -}}{{ fail "hugepages.size must be 2Mi or 1Gi" }}
{{- end -}}
{{- end -}}

{{/*
pegad's config file: the values' config with the keys the chart owns set
from the other values.
*/}}
{{- define "pegad.config" -}}
{{- $c := deepCopy .Values.config -}}
{{- $_ := set $c "listen" (printf "0.0.0.0:%d" (int .Values.ports.peer)) -}}
{{- $_ := set $c "metrics-listen" (printf "0.0.0.0:%d" (int .Values.ports.metrics)) -}}
{{- $_ := set $c "tcp-data-listen" (printf "0.0.0.0:%d" (int .Values.ports.dataBase)) -}}
{{- $_ := set $c "socket" (include "pegad.socketPath" .) -}}
{{- $_ := set $c "socket-group" (toString .Values.socket.group) -}}
{{- if .Values.hugepages.enabled -}}
{{- $_ := set $c "pool-hugepages" (include "pegad.poolHugePages" .) -}}
{{- end -}}
{{- if .Values.peerTLS.enabled -}}
{{- $_ := set $c "peer-tls-cert" (printf "%s/tls.crt" (include "pegad.tlsDir" .)) -}}
{{- $_ := set $c "peer-tls-key" (printf "%s/tls.key" (include "pegad.tlsDir" .)) -}}
{{- $_ := set $c "peer-tls-ca" (printf "%s/ca.crt" (include "pegad.tlsDir" .)) -}}
{{- with .Values.peerTLS.allow -}}
{{- $_ := set $c "peer-allow" . -}}
{{- end -}}
{{- end -}}
{{- if .Values.redis.url -}}
{{- $_ := set $c "cluster-redis" .Values.redis.url -}}
{{- end -}}
{{- if or .Values.redis.url .Values.redis.existingSecret -}}
{{- $_ := set $c "cluster-ttl" .Values.redis.ttl -}}
{{- end -}}
{{- if .Values.kvEvents.enabled -}}
{{- $_ := set $c "kv-events-endpoint" (printf "tcp://*:%d" (int .Values.kvEvents.port)) -}}
{{- if .Values.kvEvents.replayPort -}}
{{- $_ := set $c "kv-events-replay-endpoint" (printf "tcp://*:%d" (int .Values.kvEvents.replayPort)) -}}
{{- end -}}
{{- $_ := set $c "kv-events-topic" .Values.kvEvents.topic -}}
{{- end -}}
{{- toYaml $c -}}
{{- end -}}
