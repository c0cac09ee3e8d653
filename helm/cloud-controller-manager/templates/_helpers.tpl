{{/* The prefix of every object's name. */}}
{{- define "ccm.base" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The controllers: values key, component name, gateway role. */}}
{{- define "ccm.controllers" -}}
- {key: nodeController, name: node-controller, role: node}
- {key: serviceController, name: service-controller, role: service}
- {key: routeController, name: route-controller, role: route}
{{- end -}}

{{/* "true" when the controller `key` runs: (dict "root" $ "key" "routeController").
Its `enabled` says so; the route controller's, left null, is on except
with the AWS provider, whose clusters (VPC CNI) route pods without it. */}}
{{- define "ccm.on" -}}
{{- $c := index .root.Values .key -}}
{{- if kindIs "bool" $c.enabled -}}
{{- if $c.enabled }}true{{ end -}}
{{- else if not (and .root.Values.gateway.enabled (eq .root.Values.gateway.provider "aws")) -}}
true
{{- end -}}
{{- end -}}

{{/* The gateway's provider, checked: there is no default, since the sim on a
real cluster knows none of its machines and has its Nodes deleted. */}}
{{- define "ccm.provider" -}}
{{- $sim := "sim (the simulated cloud, only for trying the chart on a throwaway cluster: it deletes the Nodes it does not know)" -}}
{{- $provider := .Values.gateway.provider | default "" -}}
{{- if not $provider -}}
{{- fail (printf "gateway.provider is required: aws (with gateway.aws.region; see helm/aws/README.md) or %s" $sim) -}}
{{- else if not (has $provider (list "aws" "sim")) -}}
{{- fail (printf "gateway.provider %q is not a provider: use aws or %s" $provider $sim) -}}
{{- end -}}
{{- $provider -}}
{{- end -}}

{{/* Labels selecting one component's pods: (dict "root" $ "component" "gateway"). */}}
{{- define "ccm.selector" -}}
app.kubernetes.io/name: cloud-controller-manager
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ccm.labels" -}}
{{ include "ccm.selector" . }}
app.kubernetes.io/part-of: cloud-controller-manager
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The image of a component: (dict "root" $ "values" $componentValues). */}}
{{- define "ccm.image" -}}
{{- $image := merge (dict) (.values.image | default dict) .root.Values.image -}}
{{- printf "%s:%s" $image.repository (default .root.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* How controllers reach the gateway. */}}
{{- define "ccm.gatewayAddress" -}}
{{- if .Values.gateway.address -}}
{{- .Values.gateway.address -}}
{{- else if .Values.gateway.enabled -}}
{{- $env := printf "%s-gateway" (include "ccm.base" .) | upper | replace "-" "_" -}}
{{- printf "https://$(%s_SERVICE_HOST):%v" $env .Values.gateway.grpcPort -}}
{{- else -}}
{{- fail "gateway.address is required when gateway.enabled is false" -}}
{{- end -}}
{{- end -}}

{{/* The name the gateway's certificate carries (the Service's), which the
controllers verify while they reach it by the Service's address. */}}
{{- define "ccm.gatewayServerName" -}}
{{- printf "%s-gateway.%s.svc" (include "ccm.base" .) .Release.Namespace -}}
{{- end -}}

{{/* The Secret with the gateway's tls.crt, tls.key and ca.crt (the CA the
controllers trust), checked: with the gateway off, the Secret that holds
the external gateway's ca.crt. */}}
{{- define "ccm.gatewayTlsSecret" -}}
{{- $tls := .Values.gateway.tls -}}
{{- if not .Values.gateway.enabled -}}
{{- $_ := include "ccm.gatewayAddress" . -}}
{{- $tls.existingSecret | required "gateway.tls.existingSecret is required when gateway.enabled is false: a Secret whose ca.crt signed the external gateway's certificate" -}}
{{- else if eq $tls.source "existingSecret" -}}
{{- $tls.existingSecret | required "gateway.tls.existingSecret is required with gateway.tls.source existingSecret: a Secret with tls.crt, tls.key and ca.crt" -}}
{{- else if has $tls.source (list "helm" "cert-manager") -}}
{{- printf "%s-gateway-tls" (include "ccm.base" .) -}}
{{- else -}}
{{- fail (printf "gateway.tls.source %q: use helm, cert-manager or existingSecret" $tls.source) -}}
{{- end -}}
{{- end -}}

{{/* Pod settings every component shares: (dict "root" $ "component" name). */}}
{{- define "ccm.podCommon" -}}
{{- $v := .root.Values -}}
serviceAccountName: {{ include "ccm.base" .root }}-{{ .component }}
priorityClassName: {{ $v.priorityClassName }}
{{- if $v.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
enableServiceLinks: true
securityContext:
  {{- toYaml $v.podSecurityContext | nindent 2 }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $v.affinity }}
affinity:
  {{- toYaml $v.affinity | nindent 2 }}
{{- else }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "ccm.selector" . | nindent 14 }}
{{- end }}
{{- end -}}

{{/* Liveness and readiness on the admin port, which serves HTTPS only;
the kubelet does not verify the certificate, and /livez and /readyz need
no token. */}}
{{- define "ccm.probes" -}}
livenessProbe:
  httpGet: {path: /livez, port: admin, scheme: HTTPS}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: admin, scheme: HTTPS}
  periodSeconds: 5
  failureThreshold: 2
startupProbe:
  httpGet: {path: /livez, port: admin, scheme: HTTPS}
  periodSeconds: 2
  failureThreshold: 60
{{- end -}}

{{/* `config` map → --key=value flags. */}}
{{- define "ccm.configArgs" -}}
{{- range $k, $v := . }}
- --{{ $k }}={{ $v }}
{{- end }}
{{- end -}}

{{/* "true" when the diagnostics API is served: diagnostics.enabled and
a controller runs to serve it. */}}
{{- define "ccm.diagnosticsOn" -}}
{{- $root := . -}}
{{- $on := "" -}}
{{- if .Values.diagnostics.enabled -}}
{{- range (include "ccm.controllers" . | fromYamlArray) -}}
{{- if include "ccm.on" (dict "root" $root "key" .key) -}}{{- $on = "true" -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- $on -}}
{{- end -}}

{{/* The label the diagnostics Service selects the controllers' pods by
(with the instance label); pod labels only, never a Deployment's selector. */}}
{{- define "ccm.diagnosticsLabel" -}}
cloudgateway.io/diagnostics: "true"
{{- end -}}

{{/* The name the diagnostics API's certificate carries, the one
kube-apiserver verifies it by (the Service's). */}}
{{- define "ccm.diagnosticsServerName" -}}
{{- printf "%s-diagnostics.%s.svc" (include "ccm.base" .) .Release.Namespace -}}
{{- end -}}

{{/* Where the diagnostics API's certificate comes from, checked: the
Secret of diagnostics.tls.existingSecret when named, else where the
gateway's comes from (helm or cert-manager). */}}
{{- define "ccm.diagnosticsTlsSource" -}}
{{- $tls := .Values.diagnostics.tls -}}
{{- if $tls.existingSecret -}}
existingSecret
{{- else if eq .Values.gateway.tls.source "existingSecret" -}}
{{- fail (printf "diagnostics.tls.existingSecret is required with gateway.tls.source existingSecret: a Secret with tls.crt and tls.key for %s and the ca.crt that signed them (or turn diagnostics.enabled off)" (include "ccm.diagnosticsServerName" .)) -}}
{{- else if $tls.caBundle -}}
{{- fail "diagnostics.tls.caBundle is the CA of diagnostics.tls.existingSecret: name that Secret, or leave caBundle empty" -}}
{{- else -}}
{{- .Values.gateway.tls.source -}}
{{- end -}}
{{- end -}}

{{/* The Secret with the diagnostics API's tls.crt and tls.key. */}}
{{- define "ccm.diagnosticsTlsSecret" -}}
{{- if eq (include "ccm.diagnosticsTlsSource" .) "existingSecret" -}}
{{- .Values.diagnostics.tls.existingSecret -}}
{{- else -}}
{{- printf "%s-diagnostics-tls" (include "ccm.base" .) -}}
{{- end -}}
{{- end -}}

{{/* Cluster Autoscaler's identity at the gateway, the one URI SAN of its
client certificate where cert-manager issues it: autoscaler.identity, or
the SPIFFE ID of the ServiceAccount cluster-autoscaler in the release's
namespace. */}}
{{- define "ccm.autoscalerIdentity" -}}
{{- .Values.autoscaler.identity | default (printf "spiffe://cluster.local/ns/%s/sa/cluster-autoscaler" .Release.Namespace) -}}
{{- end -}}

{{/* The gateway's --client-cert-roles entry for Cluster Autoscaler: its
URI where cert-manager issues its certificate, its common name where the
chart does (Sprig signs no URI SAN; the chart's client CA signs nothing
else). */}}
{{- define "ccm.autoscalerRole" -}}
{{- if eq .Values.gateway.tls.source "helm" -}}
CN=cluster-autoscaler=autoscaler
{{- else -}}
{{- printf "%s=autoscaler" (include "ccm.autoscalerIdentity" .) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the volume controller runs (volumes.enabled), with its
CSIDriver, sidecars and StorageClass. */}}
{{- define "ccm.volumesOn" -}}
{{- if .Values.volumes.enabled }}true{{ end -}}
{{- end -}}

{{/* The CSI driver's name, checked: volumes.csiDriver, else the gateway's
provider's (the name the volume controller reports to the sidecars). With
the gateway elsewhere there is no provider to ask. */}}
{{- define "ccm.csiDriver" -}}
{{- if .Values.volumes.csiDriver -}}
{{- .Values.volumes.csiDriver -}}
{{- else if not .Values.gateway.enabled -}}
{{- fail "volumes.csiDriver is required when gateway.enabled is false: the CSI driver the external gateway's provider serves (sim.csi.cloudgateway.io for sim, ebs.csi.aws.com for aws)" -}}
{{- else -}}
{{- get (dict "sim" "sim.csi.cloudgateway.io" "aws" "ebs.csi.aws.com") (include "ccm.provider" .) -}}
{{- end -}}
{{- end -}}

{{/* The CSI sidecars that run (values key, container name, the Lease it
elects its leader by), as a YAML list. Each sidecar names its Lease after
the driver, as csi-lib-utils' leader election sanitises it: every
character but [a-zA-Z0-9-] becomes "-" (the provisioner's is the driver's
alone; the others' carry a prefix, as each sidecar's main.go has it). */}}
{{- define "ccm.csiSidecars" -}}
{{- $driver := regexReplaceAll "[^a-zA-Z0-9-]" (include "ccm.csiDriver" .) "-" -}}
{{- if hasSuffix "-" $driver }}{{ $driver = printf "%sX" $driver }}{{ end -}}
- {key: provisioner, name: csi-provisioner, lease: {{ $driver }}}
- {key: attacher, name: csi-attacher, lease: external-attacher-leader-{{ $driver }}}
- {key: resizer, name: csi-resizer, lease: external-resizer-{{ $driver }}}
{{- if .Values.volumes.sidecars.snapshotter.enabled }}
- {key: snapshotter, name: csi-snapshotter, lease: external-snapshotter-leader-{{ $driver }}}
{{- end }}
{{- end -}}
