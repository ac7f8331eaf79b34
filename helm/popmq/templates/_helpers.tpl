{{/*
Names. The full name is cut to 40 characters so that "<fullname>-broker-headless" (a Service)
and "<fullname>-broker" (a StatefulSet, whose revision label adds 11 characters) stay within
Kubernetes' 63-character limits.
*/}}
{{- define "popmq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "popmq.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "popmq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "popmq.broker.fullname" -}}{{ include "popmq.fullname" . }}-broker{{- end -}}
{{- define "popmq.broker.headless" -}}{{ include "popmq.fullname" . }}-broker-headless{{- end -}}
{{- define "popmq.etcd.fullname" -}}{{ include "popmq.fullname" . }}-etcd{{- end -}}
{{- define "popmq.proxy.fullname" -}}{{ include "popmq.fullname" . }}-proxy{{- end -}}
{{- define "popmq.proxy.metricsService" -}}{{ include "popmq.fullname" . }}-proxy-metrics{{- end -}}
{{- define "popmq.configName" -}}{{ include "popmq.fullname" . }}-config{{- end -}}

{{- define "popmq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "popmq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels. Call with (dict "ctx" $ "component" "broker"). */}}
{{- define "popmq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "popmq.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{- define "popmq.labels" -}}
helm.sh/chart: {{ include "popmq.chart" .ctx }}
{{ include "popmq.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: popmq
{{- end -}}

{{- define "popmq.image" -}}
{{- $image := .Values.image -}}
{{- $name := ternary (printf "%s/%s" $image.registry $image.repository) $image.repository (ne $image.registry "") -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $name $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Secrets: the cluster token and the ACL, by name and key. */}}
{{- define "popmq.clusterTokenSecretName" -}}
{{- default (printf "%s-cluster-token" (include "popmq.fullname" .)) .Values.clusterToken.existingSecret -}}
{{- end -}}

{{- define "popmq.clusterTokenKey" -}}
{{- if .Values.clusterToken.existingSecret -}}
{{- .Values.clusterToken.existingSecretKey -}}
{{- else -}}
cluster-token
{{- end -}}
{{- end -}}

{{- define "popmq.aclSecretName" -}}
{{- default (printf "%s-acl" (include "popmq.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "popmq.aclKey" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecretKey -}}
{{- else -}}
acl.yaml
{{- end -}}
{{- end -}}

{{/* Where the pods find the Secrets' files. */}}
{{- define "popmq.secretsDir" -}}/var/run/popmq{{- end -}}

{{/* The Secret with the proxies' client certificate towards mutual-TLS brokers. */}}
{{- define "popmq.proxyClientTlsSecret" -}}
{{- if .Values.tls.enabled -}}{{ .Values.tls.secretName }}{{- else -}}{{ .Values.tls.brokers.secretName }}{{- end -}}
{{- end -}}

{{/* A probe: gRPC health where the port is plaintext; TCP where it speaks TLS. */}}
{{- define "popmq.probe" -}}
{{- if .tls -}}
tcpSocket:
  port: {{ .port }}
{{- else -}}
grpc:
  port: {{ .port }}
{{- end }}
{{ toYaml .timing }}
{{- end -}}

{{/*
Brokers as the proxy reaches them: one per StatefulSet pod, named after the pod (the broker's
--name is its pod name, so receipt handles name a broker that keeps its identity across
restarts) and addressed by the pod's stable DNS name under the headless Service.
Renders one NAME=HOST:PORT per line.
*/}}
{{- define "popmq.brokerList" -}}
{{- $sts := include "popmq.broker.fullname" . -}}
{{- $headless := include "popmq.broker.headless" . -}}
{{- range $i := until (int .Values.broker.replicas) }}
{{ printf "%s-%d=%s-%d.%s.%s.svc.%s:%d" $sts $i $sts $i $headless $.Release.Namespace $.Values.clusterDomain (int $.Values.broker.port) }}
{{- end }}
{{- end -}}

{{/*
etcd's client URLs: etcd.endpoints (an existing etcd), or the chart's own 3-member StatefulSet
(etcd.enabled); empty: no etcd (each broker is a group of one, proxies list every broker).
Renders them joined with commas.
*/}}
{{- define "popmq.etcdEndpoints" -}}
{{- if .Values.etcd.endpoints -}}
{{- join "," .Values.etcd.endpoints -}}
{{- else if .Values.etcd.enabled -}}
{{- $sts := include "popmq.etcd.fullname" . -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc.%s:%d" $sts $i $sts $.Release.Namespace $.Values.clusterDomain (int $.Values.etcd.clientPort)) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}
{{- end -}}

{{/*
The broker StatefulSets, as a YAML list: without brokerGroups, one (`<fullname>-broker`,
broker.replicas pods; with etcd it is one group named after it); with brokerGroups, one per
group (`<fullname>-broker-<name>`, the group's replicas = its nodes, its own replication mode
and min in-sync count), each a group on etcd. Fields: name, replicas, group ("" none),
label ("" none: the pods of the single StatefulSet keep the selector they always had),
replication and minInSync (the single StatefulSet: "off", 1; its nodes elect a leader but
hold no copies: replicated groups are brokerGroups entries).
*/}}
{{- define "popmq.brokerSets" -}}
{{- $etcd := include "popmq.etcdEndpoints" . -}}
{{- $sets := list -}}
{{- if .Values.brokerGroups -}}
{{- range $g := .Values.brokerGroups -}}
{{- $name := printf "%s-%s" (include "popmq.broker.fullname" $) $g.name -}}
{{- $sets = append $sets (dict "name" $name "replicas" (int (default 3 $g.replicas)) "group" $name "label" $g.name "replication" (default "sync" $g.replication) "minInSync" (int (default 2 $g.minInSync))) -}}
{{- end -}}
{{- else -}}
{{- $name := include "popmq.broker.fullname" . -}}
{{- $sets = append $sets (dict "name" $name "replicas" (int .Values.broker.replicas) "group" (ternary $name "" (ne $etcd "")) "label" "" "replication" "off" "minInSync" 1) -}}
{{- end -}}
{{- toYaml $sets -}}
{{- end -}}

{{/*
The address written into routes (values.yaml, proxy.advertise). "" means none: the proxy then
answers QueryRoute with the address the client itself connected to, which is right for the
Service DNS name, a LoadBalancer and a port-forward alike.
*/}}
{{- define "popmq.advertiseHost" -}}
{{- .Values.proxy.advertise.host -}}
{{- end -}}

{{- define "popmq.advertisePort" -}}
{{- if .Values.proxy.advertise.podIP -}}
{{- int (default .Values.proxy.port .Values.proxy.advertise.port) -}}
{{- else -}}
{{- int (default .Values.proxy.service.port .Values.proxy.advertise.port) -}}
{{- end -}}
{{- end -}}

{{/*
The popmq config file (popmq/config.py's PopmqConfig) as YAML: values.config plus what the chart
knows better than the user (an explicitly advertised address). Listen addresses, ports, broker names,
the broker list and the files of the ACL, TLS and cluster token (mounted Secrets) go on the
command line.
*/}}
{{- define "popmq.configDocument" -}}
{{- $config := deepCopy .Values.config -}}
{{- $proxy := default (dict) $config.proxy -}}
{{- if .Values.proxy.advertise.host -}}
{{- $_ := set $proxy "advertise_host" .Values.proxy.advertise.host -}}
{{- end -}}
{{- if or .Values.proxy.advertise.host .Values.proxy.advertise.podIP -}}
{{- $_ := set $proxy "advertise_port" (include "popmq.advertisePort" . | int) -}}
{{- end -}}
{{- $_ := set $config "proxy" $proxy -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Checks across values that values.schema.json cannot express. */}}
{{- define "popmq.validate" -}}
{{- $p := .Values.config.proxy -}}
{{- if gt (int $p.min_long_polling_ms) (int $p.max_long_polling_ms) -}}
{{- fail (printf "config.proxy.min_long_polling_ms (%v) must not exceed config.proxy.max_long_polling_ms (%v)" $p.min_long_polling_ms $p.max_long_polling_ms) -}}
{{- end -}}
{{- if gt (int $p.min_invisible_ms) (int $p.max_invisible_ms) -}}
{{- fail (printf "config.proxy.min_invisible_ms (%v) must not exceed config.proxy.max_invisible_ms (%v)" $p.min_invisible_ms $p.max_invisible_ms) -}}
{{- end -}}
{{- $b := .Values.config.broker.pop -}}
{{- if gt (int $b.min_invisible_ms) (int $b.max_invisible_ms) -}}
{{- fail (printf "config.broker.pop.min_invisible_ms (%v) must not exceed config.broker.pop.max_invisible_ms (%v)" $b.min_invisible_ms $b.max_invisible_ms) -}}
{{- end -}}
{{- if lt (int .Values.proxy.terminationGracePeriodSeconds) (add1 (div (int $p.max_long_polling_ms) 1000)) -}}
{{- fail (printf "proxy.terminationGracePeriodSeconds (%v) must be longer than config.proxy.max_long_polling_ms (%v ms), or shutdown cuts long polls short" .Values.proxy.terminationGracePeriodSeconds $p.max_long_polling_ms) -}}
{{- end -}}
{{- $hpa := .Values.proxy.autoscaling -}}
{{- if and $hpa.enabled (gt (int $hpa.minReplicas) (int $hpa.maxReplicas)) -}}
{{- fail (printf "proxy.autoscaling.minReplicas (%v) must not exceed proxy.autoscaling.maxReplicas (%v)" $hpa.minReplicas $hpa.maxReplicas) -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.enabled needs tls.secretName (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.tls.brokers.enabled (not .Values.tls.brokers.secretName) -}}
{{- fail "tls.brokers.enabled needs tls.brokers.secretName (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.tls.clientAuth (not .Values.tls.enabled) -}}
{{- fail "tls.clientAuth needs tls.enabled" -}}
{{- end -}}
{{- if and .Values.tls.brokers.mutual (not .Values.tls.brokers.enabled) -}}
{{- fail "tls.brokers.mutual needs tls.brokers.enabled" -}}
{{- end -}}
{{- if and .Values.proxy.adminPort (or (eq (int .Values.proxy.adminPort) (int .Values.proxy.port)) (and .Values.proxy.metrics.enabled (eq (int .Values.proxy.adminPort) (int .Values.proxy.metrics.port)))) -}}
{{- fail (printf "proxy.adminPort (%v) must differ from proxy.port and proxy.metrics.port" .Values.proxy.adminPort) -}}
{{- end -}}
{{- if and .Values.etcd.enabled .Values.etcd.endpoints -}}
{{- fail "set either etcd.enabled (the chart runs etcd) or etcd.endpoints (an existing one), not both" -}}
{{- end -}}
{{- if and .Values.brokerGroups (not (include "popmq.etcdEndpoints" .)) -}}
{{- fail "brokerGroups needs etcd: set etcd.enabled or etcd.endpoints" -}}
{{- end -}}
{{- range $g := .Values.brokerGroups -}}
{{- if gt (int (default 2 $g.minInSync)) (int (default 3 $g.replicas)) -}}
{{- fail (printf "brokerGroups %s: minInSync (%v) must not exceed replicas (%v)" $g.name (default 2 $g.minInSync) (default 3 $g.replicas)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.proxy.advertise.podIP .Values.proxy.advertise.host -}}
{{- fail "set either proxy.advertise.host or proxy.advertise.podIP, not both" -}}
{{- end -}}
{{- if and .Values.proxy.metrics.enabled (eq (int .Values.proxy.metrics.port) (int .Values.proxy.port)) -}}
{{- fail (printf "proxy.metrics.port and proxy.port are both %v" .Values.proxy.port) -}}
{{- end -}}
{{- end -}}

{{/* A shared security context with a component's keys on top (each key replaced whole: a
false or empty value there wins too, which sprig's merge would not let it). */}}
{{- define "popmq.overlay" -}}
{{- $out := deepCopy (.base | default dict) -}}
{{- range $key, $value := (.over | default dict) }}
{{- $_ := set $out $key $value }}
{{- end }}
{{- toYaml $out -}}
{{- end -}}
