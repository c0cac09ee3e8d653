#!/usr/bin/env python3
"""Checks the Helm chart with a real Helm engine (helm-python-sdk embeds Helm
v4) and the Kubernetes JSON schemas (kubernetes-validate), offline.

    python3 helm/check.py check       lint, render variants, schema, validate
    python3 helm/check.py render [--release R] [--namespace N] [--set k=v ...]
                                      print the rendered manifests
    python3 helm/check.py upgrade-baseline
                                      at a release: record what an upgrade
                                      from it must keep (compat/baseline.json)

`make test` installs both packages (tests/requirements.txt); the Rust test
tests/tests/chart.rs runs `check` and renders the chart for the RBAC-enforced
end-to-end scenarios.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import shutil
import ssl
import sys
import tempfile
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import kubernetes_validate.utils as kv_utils
import yaml

CHART = Path(__file__).resolve().parent / "cloud-controller-manager"
RELEASE, NAMESPACE = "ccm", "kube-system"
CONTROLLERS = ("nodeController", "serviceController", "routeController")
# gateway.provider has no default: the checks not about a provider run on the sim.
SIM = {"gateway": {"provider": "sim"}}
COMPONENTS = {"gateway": "gateway", "nodeController": "node-controller",
              "serviceController": "service-controller", "routeController": "route-controller"}


def deep_set(values: dict, dotted: str, value) -> dict:
    out = copy.deepcopy(values)
    node = out
    keys = dotted.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return out


def merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`, maps merged key by key as Helm merges values files."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# Every render that named insecureSkipVerify anywhere, by its values: a
# scraper (or any client) that skips verification hands its token to
# whoever answers, so no combination may render one (check_no_skipped_verification).
SKIPPED_VERIFICATION: list[str] = []


def render(values: dict | None = None, release: str = RELEASE, namespace: str = NAMESPACE) -> list[dict]:
    chart = helm.Chart.load(CHART)
    chart.validate_schema(values or {})
    out = chart.render(values or {}, name=release, namespace=namespace, is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        if "insecureSkipVerify" in text:
            SKIPPED_VERIFICATION.append(f"{path} with {json.dumps(values or {}, sort_keys=True)}")
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def render_sim(values: dict | None = None) -> list[dict]:
    """`render` with `values` over gateway.provider=sim."""
    return render(merge(SIM, values or {}))


def render_unchecked(values: dict) -> None:
    """Renders as `helm template --skip-schema-validation` does: a copy of
    the chart without its schema, so only the templates' own checks run."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / CHART.name
        shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("values.schema.json"))
        helm.Chart.load(chart).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


class Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.count = 0

    def expect(self, ok: bool, what: str) -> None:
        self.count += 1
        if not ok:
            self.failures.append(what)


def kinds(docs: list[dict]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d["metadata"]["name"])
    return out


def containers(docs: list[dict]):
    for d in docs:
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                yield d, c


def check_rules(c: Checks, rule: dict, name: str) -> None:
    """A PrometheusRule's shape: every alert named once, with an expression,
    a severity and a summary and description for whoever is paged."""
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    names = [a.get("alert") for a in alerts]
    c.expect(len(alerts) > 0 and len(set(names)) == len(names) and all(names), f"{name}: alerts named once")
    for a in alerts:
        c.expect(bool(a.get("expr", "").strip()) and a.get("labels", {}).get("severity") in ("warning", "critical")
                 and a.get("annotations", {}).get("summary") and a.get("annotations", {}).get("description"),
                 f"{name}: {a.get('alert')} has an expression, a severity, a summary and a description")


def dashboard_queries(docs: list[dict]) -> list[str]:
    """Every PromQL query of the dashboard ConfigMap."""
    out = []
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"):
            for text in d["data"].values():
                for panel in json.loads(text)["panels"]:
                    out.extend(t["expr"] for t in panel.get("targets", []))
    return out


def rule_queries(docs: list[dict]) -> list[str]:
    return [r["expr"] for d in docs if d["kind"] == "PrometheusRule"
            for g in d["spec"]["groups"] for r in g["rules"]]


def validate_all(c: Checks, docs: list[dict], label: str) -> None:
    version = kv_utils.latest_version()
    for d in docs:
        name = f"{label}: {d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "ServiceMonitor":
            # A CRD the Kubernetes schemas do not carry: check its shape.
            spec = d.get("spec", {})
            c.expect(bool(spec.get("selector", {}).get("matchLabels")) and bool(spec.get("endpoints")),
                     f"{name}: selector and endpoints")
            continue
        if d["kind"] == "PrometheusRule":
            check_rules(c, d, name)
            continue
        if d["kind"] == "Certificate":
            # cert-manager's CRD: its shape (a name of some kind: DNS names
            # for a server, a URI for a client, a common name for a CA).
            spec = d.get("spec", {})
            c.expect(bool(spec.get("secretName")) and bool(spec.get("issuerRef", {}).get("name"))
                     and bool(spec.get("dnsNames") or spec.get("uris") or (spec.get("isCA") and spec.get("commonName"))),
                     f"{name}: secretName, issuerRef and what it names")
            continue
        if d["kind"] == "Issuer":
            spec = d.get("spec", {})
            c.expect(spec in ({"selfSigned": {}},) or (list(spec) == ["ca"] and bool(spec["ca"].get("secretName"))),
                     f"{name}: self-signed, or a CA from a Secret: {spec}")
            continue
        try:
            kubernetes_validate.validate(d, version, strict=True)
            c.expect(True, name)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            c.expect(False, f"{name} is not valid Kubernetes {version}: {str(e).splitlines()[0]}")


# The gateway off: an external one at this address, whose certificate the
# CA in this Secret signed.
GATEWAY_ELSEWHERE = {"gateway": {"enabled": False, "address": "https://10.0.0.10:7400",
                                 "tls": {"existingSecret": "external-gateway-ca"}}}


# The diagnostics API (diagnostics.cloudgateway.io/v1), served by every
# controller replica behind ccm-diagnostics.
DIAGNOSTICS_PORTS = {"node-controller": 7412, "service-controller": 7422, "route-controller": 7432}
DIAGNOSTICS_LABEL = {"cloudgateway.io/diagnostics": "true"}
DIAGNOSTICS_NAMES = ["ccm-diagnostics.kube-system.svc", "ccm-diagnostics.kube-system.svc.cluster.local"]
DIAGNOSTICS_TLS_DIR = "/etc/cloud-controller-manager/diagnostics-tls"
# A CA's PEM as diagnostics.tls.caBundle takes it (the chart does not parse it).
DIAGNOSTICS_CA = "-----BEGIN CERTIFICATE-----\nZXhhbXBsZSBDQQ==\n-----END CERTIFICATE-----\n"
LEASES = ["ccm-node-controller", "ccm-service-controller", "ccm-route-controller"]
# What each controller reads to answer it, in the release's namespace.
DIAGNOSTICS_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": LEASES, "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["endpoints"], "resourceNames": ["ccm-gateway"], "verbs": ["get"]},
]
VIEWER_CLUSTER_RULES = [
    {"apiGroups": [""], "resources": ["services", "nodes"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    {"apiGroups": ["diagnostics.cloudgateway.io"], "resources": ["servicediagnoses", "nodediagnoses"],
     "verbs": ["get", "list"]},
]
VIEWER_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": LEASES, "verbs": ["get"]},
    {"apiGroups": ["diagnostics.cloudgateway.io"], "resources": ["components"], "verbs": ["get", "list"]},
]
# The NetworkPolicyPeer of this release's controllers.
CONTROLLER_PEER = {"podSelector": {
    "matchLabels": {"app.kubernetes.io/name": "cloud-controller-manager", "app.kubernetes.io/instance": "ccm"},
    "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                          "values": ["node-controller", "service-controller", "route-controller"]}]}}


def tls_verifies(cert_pem: str, key_pem: str, ca_pem: str, server_name: str) -> bool:
    """A TLS handshake in memory: a server presenting `cert_pem` and a client
    that trusts `ca_pem` alone and checks `server_name`, as kube-apiserver
    checks an APIService's backend against its caBundle."""
    with tempfile.TemporaryDirectory() as tmp:
        crt, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        crt.write_text(cert_pem)
        key.write_text(key_pem)
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(crt, key)
    client_ctx = ssl.create_default_context(cadata=ca_pem)
    return handshake(client_ctx, server_ctx, server_name) is not None


def handshake(client_ctx: ssl.SSLContext, server_ctx: ssl.SSLContext, server_name: str):
    """A TLS handshake in memory between the two contexts, the client
    checking `server_name`: the server's side once it completes, else
    None."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=server_name)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    try:
        for _ in range(10):
            done = True
            for side in (client, server):
                try:
                    side.do_handshake()
                except ssl.SSLWantReadError:
                    done = False
            s_in.write(c_out.read())
            c_in.write(s_out.read())
            if done:
                return server
    except ssl.SSLError:
        return None
    return None


def rbac_rules(docs: list[dict]):
    for d in docs:
        if d["kind"] in ("ClusterRole", "Role"):
            for rule in d.get("rules", []):
                yield d, rule


def diagnostics_objects(docs: list[dict]) -> list[str]:
    """Everything of the diagnostics API in `docs`, by kind/name."""
    out = []
    for d in docs:
        name = d["metadata"]["name"]
        if any(n in name for n in ("diagnostics", "authentication-reader", "debug-reader")) or d["kind"] == "APIService":
            out.append(f"{d['kind']}/{name}")
        out.extend(f"{d['kind']}/{name} rule {rule}" for rule in d.get("rules", [])
                   if "diagnostics.cloudgateway.io" in rule.get("apiGroups", []))
    for d, ctr in containers(docs):
        pod = d["spec"]["template"]
        # The controllers' admin certificate is the diagnostics API's; the
        # gateway's is its own.
        flags = ("--diagnostics", "--release-name") + (() if d["metadata"]["name"].endswith("-gateway") else ("--admin-tls",))
        out.extend(f"{d['metadata']['name']}: {a}" for a in ctr.get("args", []) if a.startswith(flags))
        out.extend(f"{d['metadata']['name']}: port {p['name']}" for p in ctr.get("ports", []) if p["name"] == "diagnostics")
        out.extend(f"{d['metadata']['name']}: label {k}" for k in pod["metadata"]["labels"] if k in DIAGNOSTICS_LABEL)
        out.extend(f"{d['metadata']['name']}: volume {v['name']}" for v in pod["spec"]["volumes"]
                   if "diagnostics" in v["name"])
    for d in docs:
        if d["kind"] == "NetworkPolicy":
            out.extend(f"NetworkPolicy/{d['metadata']['name']}: {r}" for r in d["spec"]["ingress"]
                       if any(p["port"] == "diagnostics" for p in r.get("ports", [])))
    return out


def check_diagnostics(c: Checks, defaults: list[dict]) -> None:
    """The aggregated API diagnostics.cloudgateway.io/v1: the controllers
    serve it on their diagnostics ports, a Service in front of them,
    kube-apiserver reaching it through the APIService over verified TLS
    (certificates from each source), the controllers' grants to answer it,
    and the viewer's to read it."""
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in defaults}

    # The controllers: every replica serves it, found by a pod label the
    # Deployments' selectors leave out.
    used_ports = []
    for d, ctr in containers(defaults):
        name = d["metadata"]["name"]
        component = name.removeprefix("ccm-")
        pod = d["spec"]["template"]
        used_ports += [p["containerPort"] for p in ctr["ports"]]
        c.expect(d["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "cloud-controller-manager",
                                                          "app.kubernetes.io/instance": "ccm",
                                                          "app.kubernetes.io/component": component},
                 f"{name}: the Deployment's selector is unchanged: {d['spec']['selector']}")
        if component == "gateway":
            c.expect("cloudgateway.io/diagnostics" not in pod["metadata"]["labels"]
                     and not any(a.startswith("--diagnostics") for a in ctr["args"]),
                     "the gateway does not serve the diagnostics API")
            continue
        port = DIAGNOSTICS_PORTS[component]
        c.expect(pod["metadata"]["labels"].get("cloudgateway.io/diagnostics") == "true",
                 f"{name}'s pods carry the diagnostics Service's label")
        c.expect({"name": "diagnostics", "containerPort": port, "protocol": "TCP"} in ctr["ports"],
                 f"{name} exposes the diagnostics port {port}: {ctr['ports']}")
        for flag in (f"--diagnostics-listen=0.0.0.0:{port}", f"--diagnostics-tls-cert={DIAGNOSTICS_TLS_DIR}/tls.crt",
                     f"--diagnostics-tls-key={DIAGNOSTICS_TLS_DIR}/tls.key", "--release-name=ccm"):
            c.expect(flag in ctr["args"], f"{name} gets {flag}: {ctr['args']}")
        mount = [m for m in ctr["volumeMounts"] if m["name"] == "diagnostics-tls"]
        volume = [v for v in pod["spec"]["volumes"] if v["name"] == "diagnostics-tls"]
        c.expect(mount == [{"name": "diagnostics-tls", "mountPath": DIAGNOSTICS_TLS_DIR, "readOnly": True}]
                 and len(volume) == 1 and volume[0]["secret"]["secretName"] == "ccm-diagnostics-tls"
                 and volume[0]["secret"]["items"] == [{"key": "tls.crt", "path": "tls.crt"},
                                                      {"key": "tls.key", "path": "tls.key"},
                                                      {"key": "ca.crt", "path": "ca.crt"}],
                 f"{name} mounts the diagnostics certificate, key and CA, no subPath, so renewals reach it: {mount} {volume}")
    c.expect(len(used_ports) == len(set(used_ports)), f"every component's ports are distinct (hostNetwork): {used_ports}")

    # The Service kube-apiserver forwards to.
    service = by_name.get(("Service", "ccm-diagnostics"), {}).get("spec", {})
    c.expect(service.get("selector") == {"app.kubernetes.io/name": "cloud-controller-manager",
                                         "app.kubernetes.io/instance": "ccm", **DIAGNOSTICS_LABEL},
             f"ccm-diagnostics selects this release's pods with the diagnostics label: {service.get('selector')}")
    c.expect([{k: p.get(k) for k in ("name", "port", "targetPort")} for p in service.get("ports", [])]
             == [{"name": "https", "port": 443, "targetPort": "diagnostics"}],
             f"ccm-diagnostics serves 443 (https) from the controllers' diagnostics port: {service.get('ports')}")

    # The APIService, and the certificate it trusts, made by the chart.
    api = by_name.get(("APIService", "v1.diagnostics.cloudgateway.io"), {})
    spec = api.get("spec", {})
    c.expect({k: spec.get(k) for k in ("group", "version", "service", "groupPriorityMinimum", "versionPriority")}
             == {"group": "diagnostics.cloudgateway.io", "version": "v1",
                 "service": {"namespace": "kube-system", "name": "ccm-diagnostics", "port": 443},
                 "groupPriorityMinimum": 1000, "versionPriority": 15},
             f"the APIService sends diagnostics.cloudgateway.io/v1 to ccm-diagnostics:443: {spec}")
    secret = by_name.get(("Secret", "ccm-diagnostics-tls"), {})
    data = secret.get("stringData", {})
    gateway_ca = by_name[("Secret", "ccm-gateway-tls")]["stringData"]["ca.crt"]
    c.expect(secret.get("type") == "kubernetes.io/tls" and set(data) == {"tls.crt", "tls.key", "ca.crt"}
             and data.get("ca.crt") == gateway_ca, "the diagnostics Secret holds its certificate, key and the chart's CA")
    ca_bundle = base64.b64decode(spec.get("caBundle", "")).decode()
    c.expect(ca_bundle == gateway_ca, "the APIService's caBundle is the chart's CA")
    for san in DIAGNOSTICS_NAMES:
        c.expect(bool(data) and tls_verifies(data["tls.crt"], data["tls.key"], ca_bundle, san),
                 f"kube-apiserver verifies the diagnostics certificate against caBundle as {san}")
    c.expect(bool(data) and not tls_verifies(data["tls.crt"], data["tls.key"], ca_bundle, "ccm-gateway.kube-system.svc"),
             "the diagnostics certificate is not the gateway's")
    c.expect(not any(d.get("spec", {}).get("insecureSkipTLSVerify") for d in defaults if d["kind"] == "APIService"),
             "the APIService never skips TLS verification")

    # cert-manager: a Certificate from the gateway's issuer, its CA injected.
    issuer = {"kind": "ClusterIssuer", "name": "ca"}
    cm = render_sim({"gateway": {"tls": {"source": "cert-manager", "issuerRef": issuer}}})
    certs = {d["metadata"]["name"]: d["spec"] for d in cm if d["kind"] == "Certificate"}
    api = next((d for d in cm if d["kind"] == "APIService"), {})
    c.expect(certs.get("ccm-diagnostics", {}).get("secretName") == "ccm-diagnostics-tls"
             and certs["ccm-diagnostics"]["dnsNames"] == DIAGNOSTICS_NAMES
             and certs["ccm-diagnostics"]["issuerRef"] == certs["ccm-gateway"]["issuerRef"]
             and "Secret" not in kinds(cm), f"cert-manager: a Certificate for ccm-diagnostics from the same issuer: {certs}")
    c.expect(api.get("metadata", {}).get("annotations") == {"cert-manager.io/inject-ca-from": "kube-system/ccm-diagnostics"}
             and "caBundle" not in api.get("spec", {}) and not api["spec"].get("insecureSkipTLSVerify"),
             f"cert-manager: the cainjector fills the APIService's caBundle: {api.get('metadata')}")

    # A Secret of one's own: the caBundle given, or its ca.crt read (lookup).
    own = render_sim({"diagnostics": {"tls": {"existingSecret": "my-diagnostics-tls", "caBundle": DIAGNOSTICS_CA}}})
    validate_all(c, own, "diagnostics existingSecret")
    api = next((d for d in own if d["kind"] == "APIService"), {})
    c.expect(api.get("spec", {}).get("caBundle") == base64.b64encode(DIAGNOSTICS_CA.strip().encode()).decode()
             and "annotations" not in api.get("metadata", {}), "existingSecret: the APIService trusts diagnostics.tls.caBundle")
    c.expect(kinds(own).get("Secret") == ["ccm-gateway-tls"] and all(
        v["secret"]["secretName"] == "my-diagnostics-tls" for d, _ in containers(own)
        for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == "diagnostics-tls"),
        "existingSecret: the controllers mount the Secret named, the chart makes only the gateway's")
    unowned = render_sim({"diagnostics": {"apiService": {"create": False}, "tls": {"existingSecret": "my-diagnostics-tls"}}})
    c.expect("APIService" not in kinds(unowned) and "ccm-diagnostics" in kinds(unowned).get("Service", []),
             "apiService.create=false: the release serves the API and leaves the APIService to another")

    # The controllers' grants, exactly: in the release's namespace, and the
    # authentication ConfigMap through kube-apiserver's own Role.
    roles = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d for d in defaults}
    # One Role for every controller (any replica answers any question), so
    # any replica's reads prove each grant used.
    sas = [{"kind": "ServiceAccount", "name": f"ccm-{component}", "namespace": "kube-system"}
           for component in DIAGNOSTICS_PORTS]
    role = roles.get(("Role", "ccm-diagnostics", "kube-system"), {})
    c.expect(role.get("rules") == DIAGNOSTICS_RULES,
             f"the controllers may get the three Leases, pods and the gateway's Endpoints, no more: {role.get('rules')}")
    binding = roles.get(("RoleBinding", "ccm-diagnostics", "kube-system"), {})
    c.expect(binding.get("roleRef", {}).get("name") == "ccm-diagnostics"
             and sorted(binding.get("subjects", []), key=str) == sorted(sas, key=str),
             f"ccm-diagnostics is bound to the controllers' ServiceAccounts only: {binding.get('subjects')}")
    reader = roles.get(("RoleBinding", "ccm-authentication-reader", "kube-system"), {})
    c.expect(reader.get("roleRef") == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                       "name": "extension-apiserver-authentication-reader"}
             and sorted(reader.get("subjects", []), key=str) == sorted(sas, key=str),
             "the controllers read kube-system/extension-apiserver-authentication through the bootstrap Role")
    c.expect(not any(n == "extension-apiserver-authentication-reader" for n in kinds(defaults).get("Role", [])),
             "the chart never makes kube-apiserver's bootstrap Role")
    c.expect(not any({"pods", "endpoints", "leases", "configmaps"} & set(rule.get("resources", []))
                     for d, rule in rbac_rules(defaults) if d["kind"] == "ClusterRole"),
             "no cluster-wide grant on pods, endpoints, Leases or ConfigMaps")
    c.expect(not any(s["name"] == "ccm-gateway" for d in defaults if d["metadata"]["name"].endswith(
        ("-diagnostics", "-authentication-reader", "-debug-reader")) for s in d.get("subjects", [])),
             "the gateway, which does not serve the API, gets none of its grants")

    # No proxy anywhere: kubectl ccm reads the diagnostics API instead.
    renders = {"defaults": defaults, "cert-manager": cm, "existingSecret": own,
               "viewer bound": render_sim({"viewer": {"subjects": [{"kind": "Group", "name": "sre"}]}}),
               "diagnostics off": render_sim({"diagnostics": {"enabled": False}})}
    for what, docs in renders.items():
        proxies = [f"{d['kind']}/{d['metadata']['name']}: {r}" for d, rule in rbac_rules(docs)
                   for r in rule.get("resources", []) if "proxy" in r]
        c.expect(not proxies, f"{what}: no proxy subresource is granted: {proxies}")

    # Off: none of it, and the viewer reads what it did before.
    for what, values in (("diagnostics.enabled=false", {"diagnostics": {"enabled": False}}),
                         ("no controller", {k: {"enabled": False} for k in CONTROLLERS})):
        off = render_sim(values)
        validate_all(c, off, what)
        c.expect(diagnostics_objects(off) == [], f"{what} renders none of the diagnostics API: {diagnostics_objects(off)}")
        viewer = {d["kind"]: d["rules"] for d in off if d["metadata"]["name"] == "ccm-viewer"}
        c.expect(viewer.get("ClusterRole") == VIEWER_CLUSTER_RULES[:2] and viewer.get("Role") == VIEWER_RULES[:1],
                 f"{what}: the viewer reads Services, Nodes, Events and the Leases: {viewer}")
    c.expect(kinds(render_sim({"diagnostics": {"enabled": False}})).get("Secret") == ["ccm-gateway-tls"],
             "diagnostics off: only the gateway's certificate")

    # With the gateway elsewhere the chart still makes the diagnostics
    # certificate, under a CA of its own.
    elsewhere = render(GATEWAY_ELSEWHERE)
    secret = next((d for d in elsewhere if d["kind"] == "Secret"), {})
    api = next((d for d in elsewhere if d["kind"] == "APIService"), {})
    data = secret.get("stringData", {})
    c.expect(secret.get("metadata", {}).get("name") == "ccm-diagnostics-tls" and bool(api)
             and tls_verifies(data["tls.crt"], data["tls.key"], base64.b64decode(api["spec"]["caBundle"]).decode(),
                              DIAGNOSTICS_NAMES[0]),
             "gateway elsewhere: the chart's diagnostics certificate, trusted by the APIService")

    # What cannot render, said clearly.
    for what, values, names in (
            ("an existing diagnostics Secret without a CA to trust",
             {"diagnostics": {"tls": {"existingSecret": "my-diagnostics-tls"}}}, "diagnostics.tls.caBundle"),
            ("the gateway's own Secret without one for the diagnostics API",
             {"gateway": {"tls": {"source": "existingSecret", "existingSecret": "my-gateway-tls"}}},
             "diagnostics.tls.existingSecret"),
            ("a caBundle without the Secret it signed", {"diagnostics": {"tls": {"caBundle": DIAGNOSTICS_CA}}},
             "diagnostics.tls.existingSecret")):
        try:
            render_sim(values)
            c.expect(False, f"{what} must fail to render")
        except helm.HelmError as e:
            c.expect(names in str(e), f"{what}: the render error names {names}: {e}")


# The admin ports serve HTTPS as upstream's secure port: probes over HTTPS,
# the gateway with its gRPC certificate, the controllers with the
# diagnostics API's (self-signed with it off), and /metrics and /debug only
# for tokens allowed them (TokenReview and SubjectAccessReview through
# kube-apiserver's system:auth-delegator).
SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
GATEWAY_TLS_DIR = "/etc/cloud-gateway/tls"
AUTH_DELEGATOR_REF = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"}
METRICS_RULES = [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
DEBUG_RULES = [{"nonResourceURLs": ["/debug/status", "/debug/object"], "verbs": ["get"]}]
PROMETHEUS = {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
GATEWAY_SERVER_NAME = "ccm-gateway.kube-system.svc"


def sa(component: str) -> dict:
    return {"kind": "ServiceAccount", "name": f"ccm-{component}", "namespace": NAMESPACE}


def mounted_from(pod: dict, ctr: dict, path: str) -> tuple[str, str] | None:
    """The (Secret, key) a file path of `ctr` reads, through a whole-volume
    mount (no subPath) of a Secret volume whose items, if listed, carry it."""
    directory, _, file = path.rpartition("/")
    for m in ctr.get("volumeMounts", []):
        if m["mountPath"] == directory and "subPath" not in m:
            volume = next((v for v in pod["volumes"] if v["name"] == m["name"]), {})
            secret = volume.get("secret")
            if not secret:
                return None
            items = secret.get("items")
            if items is None:
                return secret["secretName"], file
            key = next((i["key"] for i in items if i["path"] == file), None)
            return (secret["secretName"], key) if key else None
    return None


def token_audience(pod: dict, ctr: dict, path: str) -> str | None:
    """The audience of the projected ServiceAccount token a file path of
    `ctr` reads, through a whole-volume mount; None for anything else."""
    directory, _, file = path.rpartition("/")
    for m in ctr.get("volumeMounts", []):
        if m["mountPath"] == directory and "subPath" not in m:
            volume = next((v for v in pod["volumes"] if v["name"] == m["name"]), {})
            for source in volume.get("projected", {}).get("sources", []):
                token = source.get("serviceAccountToken", {})
                if token.get("path") == file:
                    return token.get("audience")
    return None


def flag_values(ctr: dict, flag: str) -> list[str]:
    return [a.split("=", 1)[1] for a in ctr.get("args", []) if a.startswith(f"{flag}=")]


def selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels, matchExpressions with In) on `labels`."""
    return (all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
            and all(e["operator"] == "In" and labels.get(e["key"]) in e["values"]
                    for e in selector.get("matchExpressions", [])))


# The token the diagnostics API shows its peers' admin ports.
PEER_TOKEN = "/var/run/secrets/diagnostics.cloudgateway.io/token"


def check_admin_certificates(c: Checks, docs: list[dict], label: str, gateway_secret: str | None,
                             diagnostics_secret: str | None) -> None:
    """Which certificate, key and peer CA each process's admin port gets, and
    from which Secret: the gateway's from `gateway_secret`, the controllers'
    from `diagnostics_secret` (None: diagnostics off, self-signed)."""
    for d, ctr in containers(docs):
        name = d["metadata"]["name"]
        pod = d["spec"]["template"]["spec"]
        got = {flag: flag_values(ctr, flag) for flag in
               ("--admin-tls-cert", "--admin-tls-key", "--diagnostics-peer-ca-file", "--diagnostics-peer-token-file")}
        if name == "ccm-gateway":
            want = {"--admin-tls-cert": [f"{GATEWAY_TLS_DIR}/tls.crt"], "--admin-tls-key": [f"{GATEWAY_TLS_DIR}/tls.key"],
                    "--diagnostics-peer-ca-file": [], "--diagnostics-peer-token-file": []}
            c.expect(got == want, f"{label}: the gateway's admin port serves its gRPC certificate: {got}")
            c.expect([mounted_from(pod, ctr, f"{GATEWAY_TLS_DIR}/{f}") for f in ("tls.crt", "tls.key")]
                     == [(gateway_secret, "tls.crt"), (gateway_secret, "tls.key")],
                     f"{label}: the gateway's admin certificate and key come from {gateway_secret}")
        elif diagnostics_secret:
            want = {"--admin-tls-cert": [f"{DIAGNOSTICS_TLS_DIR}/tls.crt"],
                    "--admin-tls-key": [f"{DIAGNOSTICS_TLS_DIR}/tls.key"],
                    "--diagnostics-peer-ca-file": [f"{DIAGNOSTICS_TLS_DIR}/ca.crt"],
                    "--diagnostics-peer-token-file": [PEER_TOKEN]}
            c.expect(got == want, f"{label}: {name}'s admin port serves the diagnostics certificate, "
                                  f"and verifies its peers against that Secret's CA: {got}")
            c.expect(token_audience(pod, ctr, PEER_TOKEN) == "diagnostics.cloudgateway.io",
                     f"{label}: {name} shows its peers a token of the diagnostics API's audience, which the "
                     f"API server refuses, never its own API token")
            c.expect([mounted_from(pod, ctr, f"{DIAGNOSTICS_TLS_DIR}/{f}") for f in ("tls.crt", "tls.key", "ca.crt")]
                     == [(diagnostics_secret, f) for f in ("tls.crt", "tls.key", "ca.crt")],
                     f"{label}: {name}'s admin certificate, key and peer CA come from {diagnostics_secret}")
        else:
            c.expect(got == {flag: [] for flag in got},
                     f"{label}: diagnostics off, {name}'s admin port serves a self-signed certificate: {got}")


def check_admin(c: Checks, defaults: list[dict]) -> None:
    # Probes over HTTPS, paths and timings unchanged.
    probes = {"livenessProbe": ("/livez", 10, 3), "readinessProbe": ("/readyz", 5, 2), "startupProbe": ("/livez", 2, 60)}
    for docs, label in ((defaults, "defaults"), (render_sim({"diagnostics": {"enabled": False}}), "diagnostics off")):
        for d, ctr in containers(docs):
            for probe, (path, period, failures) in probes.items():
                got = ctr.get(probe, {})
                c.expect(got.get("httpGet") == {"path": path, "port": "admin", "scheme": "HTTPS"}
                         and (got.get("periodSeconds"), got.get("failureThreshold")) == (period, failures),
                         f"{label}: {d['metadata']['name']}'s {probe} gets {path} over HTTPS every {period}s: {got}")

    # The admin certificates, for each source of the Secrets.
    issuer = {"kind": "ClusterIssuer", "name": "ca"}
    own_diagnostics = {"tls": {"existingSecret": "my-diagnostics-tls", "caBundle": DIAGNOSTICS_CA}}
    sources = {
        "helm": (defaults, "ccm-gateway-tls", "ccm-diagnostics-tls"),
        "cert-manager": (render_sim({"gateway": {"tls": {"source": "cert-manager", "issuerRef": issuer}}}),
                         "ccm-gateway-tls", "ccm-diagnostics-tls"),
        "existingSecret": (render_sim({"gateway": {"tls": {"source": "existingSecret", "existingSecret": "my-gateway-tls"}},
                                       "diagnostics": own_diagnostics}), "my-gateway-tls", "my-diagnostics-tls"),
        "helm gateway, own diagnostics Secret": (render_sim({"diagnostics": own_diagnostics}),
                                                 "ccm-gateway-tls", "my-diagnostics-tls"),
        "diagnostics off": (render_sim({"diagnostics": {"enabled": False}}), "ccm-gateway-tls", None),
        "gateway elsewhere": (render(GATEWAY_ELSEWHERE), None, "ccm-diagnostics-tls"),
    }
    for label, (docs, gateway_secret, diagnostics_secret) in sources.items():
        check_admin_certificates(c, docs, label, gateway_secret, diagnostics_secret)

    # The chart's own certificates verify as the diagnostics API's replicas
    # and the ServiceMonitors check them: the peer CA file (the diagnostics
    # Secret's ca.crt) verifies the leaders' admin certificate by the
    # diagnostics Service's name and the gateway's by its Service's.
    secrets = {d["metadata"]["name"]: d["stringData"] for d in defaults if d["kind"] == "Secret"}
    peer_ca = secrets["ccm-diagnostics-tls"]["ca.crt"]
    for secret, server_name in (("ccm-diagnostics-tls", DIAGNOSTICS_NAMES[0]), ("ccm-gateway-tls", GATEWAY_SERVER_NAME)):
        c.expect(tls_verifies(secrets[secret]["tls.crt"], secrets[secret]["tls.key"], peer_ca, server_name),
                 f"the controllers' peer CA verifies the admin certificate of {secret} as {server_name}")

    # RBAC: system:auth-delegator bound to every component, never made.
    variants = {
        "defaults": (defaults, ["gateway", "node-controller", "service-controller", "route-controller"]),
        "gateway elsewhere": (render(GATEWAY_ELSEWHERE), ["node-controller", "service-controller", "route-controller"]),
        "route controller off": (render_sim({"routeController": {"enabled": False}}),
                                 ["gateway", "node-controller", "service-controller"]),
        "no controller": (render_sim({k: {"enabled": False} for k in CONTROLLERS}), ["gateway"]),
        "diagnostics off": (render_sim({"diagnostics": {"enabled": False}}),
                            ["gateway", "node-controller", "service-controller", "route-controller"]),
    }
    for label, (docs, components) in variants.items():
        by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        delegator = by_name.get(("ClusterRoleBinding", "ccm-auth-delegator"), {})
        c.expect(delegator.get("roleRef") == AUTH_DELEGATOR_REF
                 and delegator.get("subjects") == [sa(x) for x in components],
                 f"{label}: ccm-auth-delegator binds system:auth-delegator to exactly {components}: {delegator}")
        c.expect(not any(d["kind"] in ("Role", "ClusterRole") and d["metadata"]["name"] == "system:auth-delegator"
                         for d in docs), f"{label}: the chart never makes system:auth-delegator")
        reviews = [f"{d['metadata']['name']}: {rule}" for d, rule in rbac_rules(docs)
                   if {"tokenreviews", "subjectaccessreviews"} & set(rule.get("resources", []))]
        c.expect(reviews == [], f"{label}: reviews are granted through system:auth-delegator only: {reviews}")
        c.expect(("ClusterRole", "ccm-gateway") not in by_name and ("ClusterRoleBinding", "ccm-gateway") not in by_name,
                 f"{label}: the gateway needs no ClusterRole of its own")
        # /metrics for scrapers only, /debug for the controllers only.
        c.expect(by_name.get(("ClusterRole", "ccm-metrics-reader"), {}).get("rules") == METRICS_RULES,
                 f"{label}: ccm-metrics-reader grants get /metrics, nothing else")
        c.expect(("ClusterRoleBinding", "ccm-metrics-reader") not in by_name,
                 f"{label}: nobody may scrape unless metrics.scrapers names them")
        urls = [f"{d['metadata']['name']}: {rule}" for d, rule in rbac_rules(docs) if "nonResourceURLs" in rule
                and d["metadata"]["name"] not in ("ccm-metrics-reader", "ccm-debug-reader")]
        c.expect(urls == [], f"{label}: no other role grants a non-resource URL: {urls}")
        controllers = [x for x in components if x != "gateway"]
        reader = by_name.get(("ClusterRole", "ccm-debug-reader"))
        binding = by_name.get(("ClusterRoleBinding", "ccm-debug-reader"))
        if label != "diagnostics off" and controllers:
            c.expect(reader is not None and reader.get("rules") == DEBUG_RULES,
                     f"{label}: ccm-debug-reader grants get /debug/status and /debug/object, nothing else: {reader}")
            c.expect(binding is not None and binding.get("roleRef") == {"apiGroup": "rbac.authorization.k8s.io",
                                                                        "kind": "ClusterRole", "name": "ccm-debug-reader"}
                     and binding.get("subjects") == [sa(x) for x in controllers],
                     f"{label}: ccm-debug-reader is bound to exactly the controllers {controllers}: {binding}")
        else:
            c.expect(reader is None and binding is None, f"{label}: no diagnostics API, no /debug grant")

    # metrics.scrapers binds the metrics reader, to them exactly.
    scraped = render_sim({"metrics": {"scrapers": [PROMETHEUS, {"kind": "Group", "name": "scrapers"}]}})
    validate_all(c, scraped, "metrics scrapers")
    binding = next((d for d in scraped if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "ccm-metrics-reader"), {})
    c.expect(binding.get("roleRef") == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                        "name": "ccm-metrics-reader"}
             and binding.get("subjects") == [PROMETHEUS, {"kind": "Group", "name": "scrapers"}],
             f"metrics.scrapers are bound to ccm-metrics-reader, and only they: {binding}")

    # The ServiceMonitors: HTTPS, the scraper's token, the right CA and name.
    def monitors(values: dict) -> tuple[dict[str, dict], list[dict]]:
        docs = render_sim(merge(values, {"serviceMonitor": {"enabled": True}}))
        return ({d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"},
                [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics")])

    def tls_of(secret: str, server_name: str) -> dict:
        return {"ca": {"secret": {"name": secret, "key": "ca.crt"}}, "serverName": server_name}

    cases = {
        "helm": ({}, tls_of("ccm-gateway-tls", GATEWAY_SERVER_NAME), tls_of("ccm-diagnostics-tls", DIAGNOSTICS_NAMES[0])),
        "existingSecret": ({"gateway": {"tls": {"source": "existingSecret", "existingSecret": "my-gateway-tls"}},
                            "diagnostics": own_diagnostics},
                           tls_of("my-gateway-tls", GATEWAY_SERVER_NAME), tls_of("my-diagnostics-tls", DIAGNOSTICS_NAMES[0])),
        "gateway elsewhere": (GATEWAY_ELSEWHERE, None, tls_of("ccm-diagnostics-tls", DIAGNOSTICS_NAMES[0])),
        "no controller": ({k: {"enabled": False} for k in CONTROLLERS}, tls_of("ccm-gateway-tls", GATEWAY_SERVER_NAME), None),
    }
    for label, (values, gateway_tls, controllers_tls) in cases.items():
        got, services = monitors(values)
        want = {name: tls for name, tls in (("ccm-gateway", gateway_tls), ("ccm-controllers", controllers_tls)) if tls}
        c.expect(sorted(got) == sorted(want), f"{label}: a ServiceMonitor per admin certificate: {sorted(got)}")
        for name, tls in want.items():
            endpoints = got.get(name, {}).get("spec", {}).get("endpoints", [])
            c.expect(endpoints == [{"port": "admin", "path": "/metrics", "scheme": "https", "interval": "30s",
                                    "bearerTokenFile": SA_TOKEN, "tlsConfig": tls}],
                     f"{label}: {name} scrapes /metrics over HTTPS with the scraper's token, TLS {tls}: {endpoints}")
        # Each metrics Service is scraped by exactly the ServiceMonitor of its certificate.
        for svc in services:
            component = svc["metadata"]["labels"]["app.kubernetes.io/component"]
            by = [n for n, m in got.items() if selects(m["spec"]["selector"], svc["metadata"]["labels"])]
            c.expect(by == [f"ccm-{'gateway' if component == 'gateway' else 'controllers'}"],
                     f"{label}: {svc['metadata']['name']} is scraped by {by}")


# What `helm upgrade` cannot change in place (the API server refuses it,
# or the objects of the last release stop matching), by kind; and the
# kinds whose every object must still be there after an upgrade (a
# renamed Service cuts off the processes of the last release mid-upgrade).
IMMUTABLE = {
    "Deployment": ("/spec/selector",),
    "StatefulSet": ("/spec/selector", "/spec/serviceName"),
    "DaemonSet": ("/spec/selector",),
    "PodDisruptionBudget": ("/spec/selector",),
    "Service": ("/spec/selector", "/spec/ports/*/name", "/spec/clusterIP"),
}
KEPT = ("Deployment", "Service", "ServiceAccount", "Secret")
UPGRADE_BASELINE = Path(__file__).resolve().parent / "compat" / "baseline.json"
# The installs an upgrade is checked on: the sim's defaults and AWS's.
UPGRADE_VARIANTS = {"sim": SIM, "aws": {"gateway": {"provider": "aws", "aws": {"region": "eu-west-1"}}}}


def pointer(doc, path: str):
    """The values at `path` (`*` steps into every element of a list)."""
    nodes = [doc]
    for step in path.strip("/").split("/"):
        nxt = []
        for n in nodes:
            if step == "*" and isinstance(n, list):
                nxt.extend(n)
            elif isinstance(n, dict) and step in n:
                nxt.append(n[step])
        nodes = nxt
    return nodes


def upgrade_facts(docs: list[dict]) -> dict:
    """`kind/name` of each object an upgrade must keep, with its immutable fields."""
    out = {}
    for d in docs:
        kind = d["kind"]
        if kind in IMMUTABLE or kind in KEPT:
            out[f"{kind}/{d['metadata']['name']}"] = {p: pointer(d, p) for p in IMMUTABLE.get(kind, ())}
    return out


def upgrade_breaks(old: dict, new: dict) -> list[str]:
    """What an upgrade from `old` to `new` (both `upgrade_facts`) would break."""
    broken = []
    for key, fields in sorted(old.items()):
        if key not in new:
            broken.append(f"{key} is gone (renamed or removed)")
            continue
        for path, value in fields.items():
            if new[key].get(path) != value:
                broken.append(f"{key} {path}: {value} -> {new[key].get(path)}")
    return broken


def upgrade_baseline() -> int:
    facts = {name: upgrade_facts(render(values)) for name, values in UPGRADE_VARIANTS.items()}
    UPGRADE_BASELINE.parent.mkdir(exist_ok=True)
    UPGRADE_BASELINE.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    print(f"wrote {UPGRADE_BASELINE}")
    return 0


def mutual_tls(server: dict, client: dict, server_ca: str, client_ca: str, server_name: str) -> bool:
    """A mutual TLS handshake in memory: a server presenting `server`'s
    tls.crt and requiring a client certificate signed by `client_ca`, and a
    client presenting `client`'s and checking `server_name` against
    `server_ca`, as the gateway and Cluster Autoscaler meet."""
    with tempfile.TemporaryDirectory() as tmp:
        def chain(ctx: ssl.SSLContext, pair: dict, name: str) -> None:
            crt, key = Path(tmp, f"{name}.crt"), Path(tmp, f"{name}.key")
            crt.write_text(pair.get("tls.crt", ""))
            key.write_text(pair.get("tls.key", ""))
            ctx.load_cert_chain(crt, key)
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            server_ctx.load_verify_locations(cadata=client_ca)
            client_ctx = ssl.create_default_context(cadata=server_ca)
            chain(server_ctx, server, "server")
            chain(client_ctx, client, "client")
        except (ssl.SSLError, OSError, ValueError):
            return False
    server_side = handshake(client_ctx, server_ctx, server_name)
    return server_side is not None and server_side.getpeercert() is not None


def gateway_container(docs: list[dict]) -> tuple[dict, dict]:
    """The gateway's pod spec and container."""
    return next((d["spec"]["template"]["spec"], ctr) for d, ctr in containers(docs)
                if d["metadata"]["name"] == "ccm-gateway")


AUTOSCALER_ID = "spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler"


def check_autoscaler(c: Checks) -> None:
    """Cluster Autoscaler's way in: its certificate from a client CA of its
    own (never the serving certificates' issuer, so no serving certificate
    and no certificate anyone else may ask that issuer for is a client
    here), mapped to its role alone; the cloud-config naming the gateway by
    its certificate's name and its CA; the NetworkPolicy's door; and a
    ClusterIssuer for client certificates only when the operator says so."""
    docs = render_sim({"autoscaler": {"enabled": True}})
    validate_all(c, docs, "autoscaler")
    secrets = {d["metadata"]["name"]: d["stringData"] for d in docs if d["kind"] == "Secret"}
    tls, gateway = secrets.get("ccm-autoscaler-tls", {}), secrets.get("ccm-gateway-tls", {})
    client_ca = secrets.get("ccm-gateway-client-ca", {})
    c.expect(list(client_ca) == ["ca.crt"], f"the client CA's Secret holds its certificate alone: {list(client_ca)}")
    c.expect(bool(client_ca.get("ca.crt")) and client_ca.get("ca.crt") != gateway.get("ca.crt")
             and tls.get("ca.crt") == client_ca.get("ca.crt"),
             "the autoscaler's certificate comes from a client CA that is not the gateway's serving CA")
    c.expect(tls.get("gateway-ca.crt") == gateway.get("ca.crt"),
             "the autoscaler's Secret carries the CA that signed the gateway's certificate, to verify it by")
    c.expect(mutual_tls(gateway, tls, tls.get("gateway-ca.crt", ""), client_ca.get("ca.crt", ""), GATEWAY_SERVER_NAME),
             "the autoscaler and the gateway meet over mutual TLS, by the gateway's name")
    # Sprig's serving certificates carry clientAuth too: the client CA
    # is what keeps them (and whoever holds their keys: every controller
    # mounts the diagnostics API's) from being clients of the gateway.
    for name in ("ccm-gateway-tls", "ccm-diagnostics-tls"):
        c.expect(not mutual_tls(gateway, secrets.get(name, {}), gateway.get("ca.crt", ""),
                                client_ca.get("ca.crt", ""), GATEWAY_SERVER_NAME),
                 f"{name}'s certificate is no client certificate of the gateway")
        c.expect(mutual_tls(gateway, secrets.get(name, {}), gateway.get("ca.crt", ""), gateway.get("ca.crt", ""),
                            GATEWAY_SERVER_NAME),
                 f"(the handshake itself takes {name}'s certificate from a client CA that signed it)")
    config = secrets.get("ccm-autoscaler-cloud-config", {}).get("cloud-config", "")
    c.expect(f'address: "{GATEWAY_SERVER_NAME}:7400"' in config and 'cert: "/etc/cluster-autoscaler/tls/tls.crt"' in config
             and 'cacert: "/etc/cluster-autoscaler/tls/gateway-ca.crt"' in config
             and 'grpc_timeout: "60s"' in config, f"the cloud-config names the gateway and the files: {config}")
    pod, ctr = gateway_container(docs)
    args = ctr["args"]
    c.expect("--tls-client-ca=/etc/cloud-gateway/client-ca/ca.crt" in args
             and mounted_from(pod, ctr, "/etc/cloud-gateway/client-ca/ca.crt") == ("ccm-gateway-client-ca", "ca.crt")
             and "--client-cert-roles=CN=cluster-autoscaler=autoscaler" in args,
             f"the gateway trusts the client CA for clients and maps the autoscaler's certificate alone: {args}")
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "ccm-gateway")
    peers = policy["spec"]["ingress"][0]["from"]
    c.expect({"podSelector": {"matchLabels": {"app.kubernetes.io/name": "externalgrpc-cluster-autoscaler"}}} in peers,
             f"the NetworkPolicy lets the autoscaler's pods in to gRPC: {peers}")
    off = render_sim()
    c.expect(not any(d["kind"] == "Secret" and ("autoscaler" in d["metadata"]["name"] or "client-ca" in
                                                d["metadata"]["name"]) for d in off),
             "no autoscaler or client CA Secrets unless asked")
    pod, ctr = gateway_container(off)
    c.expect(not any(a.startswith("--tls-client-ca") or a.startswith("--client-cert-roles") for a in ctr["args"]),
             "no client certificate is let in unless asked")

    # cert-manager: the serving certificates from the operator's issuer (a
    # ClusterIssuer, as values.yaml's example), the autoscaler's from an
    # Issuer of the release's own, with a URI.
    managed = render_sim({"autoscaler": {"enabled": True},
                          "gateway": {"tls": {"source": "cert-manager", "issuerRef": {"kind": "ClusterIssuer",
                                                                                      "name": "my-ca"}}}})
    validate_all(c, managed, "autoscaler with cert-manager")
    objects = {f"{d['kind']}/{d['metadata']['name']}": d for d in managed}
    cert = objects.get("Certificate/ccm-autoscaler", {}).get("spec", {})
    c.expect(cert.get("usages") == ["client auth", "digital signature", "key encipherment"]
             and cert.get("secretName") == "ccm-autoscaler-tls" and cert.get("uris") == [AUTOSCALER_ID]
             and "dnsNames" not in cert and "commonName" not in cert
             and cert.get("issuerRef") == {"name": "ccm-client-ca", "kind": "Issuer", "group": "cert-manager.io"},
             f"with cert-manager, a client certificate of one URI from the release's own Issuer: {cert}")
    ca_cert = objects.get("Certificate/ccm-client-ca", {}).get("spec", {})
    c.expect(objects.get("Issuer/ccm-client-ca", {}).get("spec") == {"ca": {"secretName": "ccm-client-ca"}}
             and ca_cert.get("isCA") is True and ca_cert.get("secretName") == "ccm-client-ca"
             and ca_cert.get("privateKey", {}).get("rotationPolicy") == "Never"
             and ca_cert.get("issuerRef", {}).get("name") == "ccm-client-ca-root"
             and objects.get("Issuer/ccm-client-ca-root", {}).get("spec") == {"selfSigned": {}},
             "the release's own client CA: self-signed once, its key kept, in an Issuer of the namespace")
    serving = [d for d in managed if d["kind"] == "Certificate" and d["metadata"]["name"] in ("ccm-gateway",
                                                                                                "ccm-diagnostics")]
    c.expect(len(serving) == 2 and all(d["spec"]["usages"] == ["server auth", "digital signature", "key encipherment"]
                                       and d["spec"]["issuerRef"]["name"] == "my-ca" for d in serving),
             f"serving certificates carry serverAuth only, from the operator's issuer: {serving}")
    pod, ctr = gateway_container(managed)
    c.expect(f"--client-cert-roles={AUTOSCALER_ID}=autoscaler" in ctr["args"]
             and mounted_from(pod, ctr, "/etc/cloud-gateway/client-ca/ca.crt") == ("ccm-autoscaler-tls", "ca.crt"),
             f"with cert-manager, the gateway maps the autoscaler's URI and trusts its Issuer's CA: {ctr['args']}")
    named = render_sim({"autoscaler": {"enabled": True, "identity": "spiffe://example.org/autoscaler"},
                        "gateway": {"tls": {"source": "cert-manager", "issuerRef": {"name": "my-ca"}}}})
    pod, ctr = gateway_container(named)
    c.expect("--client-cert-roles=spiffe://example.org/autoscaler=autoscaler" in ctr["args"],
             "autoscaler.identity names the URI the gateway maps")

    # A ClusterIssuer for client certificates: only when asked by name.
    cluster_issuer = {"autoscaler": {"enabled": True}, "gateway": {"tls": {
        "source": "cert-manager", "issuerRef": {"name": "my-ca"},
        "clientCA": {"issuerRef": {"kind": "ClusterIssuer", "name": "everyones-ca"}}}}}
    try:
        render_sim(cluster_issuer)
        c.expect(False, "a role trusted through a ClusterIssuer must fail to render unless asked")
    except helm.HelmError as e:
        c.expect("gateway.tls.clientCA.trustClusterIssuer" in str(e) and "everyones-ca" in str(e),
                 f"the ClusterIssuer refusal says what to set: {e}")
    trusted = render_sim(merge(cluster_issuer, {"gateway": {"tls": {"clientCA": {"trustClusterIssuer": True}}}}))
    cert = next(d for d in trusted if d["kind"] == "Certificate" and d["metadata"]["name"] == "ccm-autoscaler")
    c.expect(cert["spec"]["issuerRef"] == {"name": "everyones-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
             and not any(d["kind"] == "Issuer" for d in trusted),
             f"trustClusterIssuer: the autoscaler's certificate from that ClusterIssuer, no Issuer of the chart's: {cert}")
    for what, values, names in (
            ("the autoscaler with a CA of the operator's", {"gateway": {"tls": {
                "source": "existingSecret", "existingSecret": "mine"}}}, "gateway.tls.source"),
            ("the autoscaler beside another client CA", {"gateway": {"tls": {
                "clientCA": {"existingSecret": "x"}, "clientCertRoles": [{"identity": "CN=x", "role": "admin"}]}}},
             "gateway.tls.clientCA.existingSecret")):
        try:
            render_sim(merge({"autoscaler": {"enabled": True}}, values))
            c.expect(False, f"{what} must fail to render")
        except helm.HelmError as e:
            c.expect(names in str(e), f"{what}: the render error names {names}: {e}")


# The volume controller (volumes.enabled) and what comes with it: its
# Deployment with upstream's CSI sidecars on one socket, the CSIDriver, the
# StorageClass, the sidecars' RBAC, the gateway's role for it, and its
# place beside the other controllers (PDB, NetworkPolicy, ServiceMonitor).
VOLUMES = {"volumes": {"enabled": True}}
CSI_SIDECARS = ["csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"]
VOLUME_OBJECTS = {("Deployment", "ccm-volume-controller"), ("ServiceAccount", "ccm-volume-controller"),
                  ("CSIDriver", "sim.csi.cloudgateway.io"), ("StorageClass", "cloud-volumes"),
                  ("PodDisruptionBudget", "ccm-volume-controller"), ("Role", "ccm-volume-controller-leases"),
                  ("RoleBinding", "ccm-volume-controller-leases")} | {
    (kind, f"ccm-{s}") for s in CSI_SIDECARS for kind in ("ClusterRole", "ClusterRoleBinding")}


def volume_objects(docs: list[dict]) -> list[str]:
    """Everything of the volume controller in `docs`, by kind/name (and
    every mention of its ServiceAccount)."""
    out = [f"{d['kind']}/{d['metadata']['name']}" for d in docs
           if d["kind"] in ("CSIDriver", "StorageClass") or "volume-controller" in d["metadata"]["name"]
           or d["metadata"]["name"] in {f"ccm-{s}" for s in CSI_SIDECARS}]
    out += [f"{d['kind']}/{d['metadata']['name']}: {s}" for d in docs for s in d.get("subjects", [])
            if "volume-controller" in s.get("name", "")]
    out += [f"{d['metadata']['name']}: {a}" for d, ctr in containers(docs) for a in ctr.get("args", [])
            if "volume" in a]
    return out


def check_volumes(c: Checks) -> None:
    report = helm.lint(str(CHART), merge(SIM, VOLUMES), strict=True, kube_version="v1.33.0", namespace=NAMESPACE)
    problems = [m for m in report.get("messages", []) if m["severity"] >= 2] + report.get("errors", [])
    c.expect(not problems, f"helm lint --strict with volumes: {problems}")
    docs = render_sim(VOLUMES)
    validate_all(c, docs, "volumes")
    have = {(d["kind"], d["metadata"]["name"]) for d in docs}
    c.expect(VOLUME_OBJECTS <= have, f"volumes.enabled renders {sorted(VOLUME_OBJECTS - have)}")
    c.expect(not any(d["kind"] == "ClusterRole" and d["metadata"]["name"] == "ccm-volume-controller" for d in docs),
             "the volume controller itself needs no ClusterRole of its own")
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "ccm-volume-controller")
    pod = deployment["spec"]["template"]["spec"]
    names = [ctr["name"] for ctr in pod["containers"]]
    c.expect(names == ["volume-controller"] + CSI_SIDECARS, f"the volume controller and its four sidecars: {names}")
    socket = [v for v in pod["volumes"] if v["name"] == "socket-dir"]
    c.expect(socket == [{"name": "socket-dir", "emptyDir": {}}], f"the socket lives in an emptyDir: {socket}")
    for ctr in pod["containers"]:
        sc = ctr["securityContext"]
        c.expect(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False
                 and sc.get("privileged") is False and sc.get("capabilities") == {"drop": ["ALL"]},
                 f"{ctr['name']}: read-only root, no privilege escalation, no capabilities")
        c.expect({"name": "socket-dir", "mountPath": "/csi"} in ctr["volumeMounts"], f"{ctr['name']} mounts /csi")
        c.expect(ctr.get("resources", {}).get("limits", {}).get("memory"), f"{ctr['name']} has a memory limit")
        if ctr["name"] in CSI_SIDECARS:
            c.expect(ctr["args"][:3] == ["--csi-address=/csi/csi.sock", "--leader-election",
                                         "--leader-election-namespace=kube-system"],
                     f"{ctr['name']} reaches the socket and elects a leader in the namespace: {ctr['args']}")
            c.expect(ctr["image"].startswith(f"registry.k8s.io/sig-storage/{ctr['name']}:v"),
                     f"{ctr['name']} runs upstream's image at a pinned release: {ctr['image']}")
    c.expect(pod["securityContext"].get("runAsNonRoot") is True, "the volume controller's pod runs as non-root")
    controller = pod["containers"][0]
    c.expect("--csi-address=unix:///csi/csi.sock" in controller["args"]
             and not any(a.startswith(("--leader-elect", "--diagnostics")) for a in controller["args"]),
             f"the volume controller serves the socket, elects no leader and serves no diagnostics API: "
             f"{controller['args']}")
    c.expect(token_audience(pod, controller, "/var/run/secrets/cloud-gateway/token") == "cloud-gateway"
             and mounted_from(pod, controller, "/etc/cloud-gateway/ca/ca.crt") == ("ccm-gateway-tls", "ca.crt"),
             "the volume controller shows the gateway a token of its audience and verifies it by its CA")
    c.expect([mounted_from(pod, controller, f"{DIAGNOSTICS_TLS_DIR}/{f}") for f in ("tls.crt", "tls.key")]
             == [("ccm-diagnostics-tls", "tls.crt"), ("ccm-diagnostics-tls", "tls.key")]
             and flag_values(controller, "--admin-tls-cert") == [f"{DIAGNOSTICS_TLS_DIR}/tls.crt"],
             "the volume controller's admin port serves the diagnostics certificate, as the controllers' do")
    _, gateway = gateway_container(docs)
    c.expect(flag_values(gateway, "--service-account-roles") == [
        "kube-system/ccm-node-controller=node,kube-system/ccm-service-controller=service,"
        "kube-system/ccm-route-controller=route,kube-system/ccm-volume-controller=volume"],
             f"the gateway gives the volume controller's ServiceAccount the role volume: {gateway['args']}")
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    leases = by_name[("Role", "ccm-volume-controller-leases")]["rules"]
    c.expect(leases == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"],
         "resourceNames": ["sim-csi-cloudgateway-io", "external-attacher-leader-sim-csi-cloudgateway-io",
                           "external-resizer-sim-csi-cloudgateway-io",
                           "external-snapshotter-leader-sim-csi-cloudgateway-io"]}],
             f"the sidecars may update their own Leases only: {leases}")
    c.expect(sa("volume-controller") in by_name[("ClusterRoleBinding", "ccm-auth-delegator")]["subjects"],
             "the volume controller's admin port checks tokens through system:auth-delegator")

    # Beside the other controllers: its admin port behind the same
    # NetworkPolicy and ServiceMonitor, the gateway's gRPC open to it.
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    beside = render_sim(merge(VOLUMES, {"networkPolicy": {"adminSources": monitoring},
                                        "serviceMonitor": {"enabled": True}}))
    validate_all(c, beside, "volumes beside the options")
    objects = {(d["kind"], d["metadata"]["name"]): d for d in beside}
    grpc = objects[("NetworkPolicy", "ccm-gateway")]["spec"]["ingress"][0]["from"][0]
    c.expect(grpc["podSelector"]["matchExpressions"][0]["values"][-1] == "volume-controller",
             f"the volume controller may reach the gateway's gRPC port: {grpc}")
    admin = objects[("NetworkPolicy", "ccm-controllers")]["spec"]["podSelector"]["matchExpressions"][0]["values"]
    c.expect("volume-controller" in admin, f"the controllers' NetworkPolicy covers the volume controller: {admin}")
    readers = objects[("NetworkPolicy", "ccm-controllers")]["spec"]["ingress"][0]["from"][-1]
    c.expect(readers == CONTROLLER_PEER, f"the diagnostics readers are still the three controllers: {readers}")
    metrics = objects.get(("Service", "ccm-volume-controller-metrics"), {}).get("spec", {})
    monitor = objects[("ServiceMonitor", "ccm-controllers")]["spec"]
    c.expect(metrics.get("ports") == [{"name": "admin", "port": 7441, "targetPort": "admin", "protocol": "TCP"}]
             and selects(monitor["selector"], objects[("Service", "ccm-volume-controller-metrics")]["metadata"]["labels"]),
             f"the controllers' ServiceMonitor scrapes the volume controller's admin port: {metrics}")

    # The provider names the driver; the gateway elsewhere needs it named.
    aws = render({"gateway": {"provider": "aws", "aws": {"region": "eu-west-1"}}, **VOLUMES})
    validate_all(c, aws, "volumes on aws")
    c.expect([d["metadata"]["name"] for d in aws if d["kind"] == "CSIDriver"] == ["ebs.csi.aws.com"]
             and [d["provisioner"] for d in aws if d["kind"] == "StorageClass"] == ["ebs.csi.aws.com"],
             "with the AWS provider the driver is ebs.csi.aws.com")
    try:
        render(merge(GATEWAY_ELSEWHERE, VOLUMES))
        c.expect(False, "volumes with the gateway elsewhere and no driver named must fail to render")
    except helm.HelmError as e:
        c.expect("volumes.csiDriver" in str(e), f"the render error names volumes.csiDriver: {e}")
    elsewhere = render(merge(GATEWAY_ELSEWHERE, {"volumes": {"enabled": True, "csiDriver": "ebs.csi.aws.com"}}))
    validate_all(c, elsewhere, "volumes with the gateway elsewhere")
    c.expect(any(d["kind"] == "CSIDriver" and d["metadata"]["name"] == "ebs.csi.aws.com" for d in elsewhere),
             "volumes.csiDriver names the driver")

    # Options: no StorageClass, no snapshotter (no snapshot CRDs), no
    # diagnostics (a self-signed admin certificate).
    lean = render_sim({"volumes": {"enabled": True, "storageClass": {"create": False},
                                   "sidecars": {"snapshotter": {"enabled": False}}},
                       "diagnostics": {"enabled": False}})
    validate_all(c, lean, "volumes without options")
    pod = next(d for d in lean if d["kind"] == "Deployment" and d["metadata"]["name"] == "ccm-volume-controller")
    pod = pod["spec"]["template"]["spec"]
    c.expect([ctr["name"] for ctr in pod["containers"]] == ["volume-controller"] + CSI_SIDECARS[:3]
             and "StorageClass" not in kinds(lean) and "ccm-csi-snapshotter" not in kinds(lean)["ClusterRole"],
             "storageClass.create=false and the snapshotter off leave out the class and the sidecar with its rules")
    c.expect(flag_values(pod["containers"][0], "--admin-tls-cert") == []
             and not any(v["name"] == "diagnostics-tls" for v in pod["volumes"]),
             "diagnostics off: the volume controller's admin port serves a self-signed certificate")

    # Off (the default): none of it.
    for what, values in (("defaults", {}), ("volumes.enabled=false", {"volumes": {"enabled": False}})):
        c.expect(volume_objects(render_sim(values)) == [], f"{what}: nothing of the volume controller renders: "
                                                        f"{volume_objects(render_sim(values))}")

    chart = helm.Chart.load(CHART)
    for what, values in {
        "a sidecar image with an empty tag": {"volumes": {"sidecars": {"attacher": {"image": {"tag": ""}}}}},
        "a sidecar flag without dashes": {"volumes": {"sidecars": {"resizer": {"extraArgs": ["timeout=60s"]}}}},
        "a driver name that is no DNS name": {"volumes": {"csiDriver": "Sim_Driver"}},
        "the socket moved through config": {"volumes": {"config": {"csi-address": "/tmp/x.sock"}}},
        "an unknown volumes key": {"volumes": {"storageclass": {}}},
    }.items():
        try:
            chart.validate_schema(values)
            c.expect(False, f"the schema accepted {what}: {values}")
        except helm.HelmError:
            c.expect(True, what)


def check_upgrade(c: Checks) -> None:
    """`helm upgrade` from the last release keeps every immutable field and
    every object the processes of that release use."""
    baseline = json.loads(UPGRADE_BASELINE.read_text())
    for name, values in UPGRADE_VARIANTS.items():
        new = upgrade_facts(render(values))
        broken = upgrade_breaks(baseline[name], new)
        c.expect(not broken, f"an upgrade of the {name} install from the last release breaks: {broken}")
    # The comparison itself sees a changed selector, port name and a
    # renamed Service.
    old = baseline["sim"]
    changed = copy.deepcopy(old)
    deployment = next(k for k in changed if k.startswith("Deployment/"))
    changed[deployment]["/spec/selector"] = [{"matchLabels": {"app": "other"}}]
    service = next(k for k in changed if k.startswith("Service/") and changed[k]["/spec/ports/*/name"])
    changed[service]["/spec/ports/*/name"] = ["renamed"]
    gone = next(k for k in changed if k.startswith("Service/") and k != service)
    del changed[gone]
    found = upgrade_breaks(old, changed)
    c.expect(len(found) == 3 and any(deployment in f for f in found) and any(gone in f and "gone" in f
                                                                               for f in found),
             f"the upgrade check names a changed selector, port name and a gone Service: {found}")


def check_no_skipped_verification(c: Checks) -> None:
    """No combination renders `insecureSkipVerify`: every combination of the
    values that decide who serves which certificate to whom is rendered
    (each render here is scanned, these and all the checks' before), and
    one that cannot verify a CA is refused, saying what to set."""
    import itertools
    sources = {
        "helm": {},
        "cert-manager": {"gateway": {"tls": {"source": "cert-manager", "issuerRef": {"name": "ca"}}}},
        "existingSecret": {"gateway": {"tls": {"source": "existingSecret", "existingSecret": "my-gateway-tls"}},
                           "diagnostics": {"tls": {"existingSecret": "my-diagnostics-tls", "caBundle": DIAGNOSTICS_CA}}},
        "gateway elsewhere": GATEWAY_ELSEWHERE,
    }
    for monitor, diagnostics, source, autoscaler, controllers in itertools.product(
            (True, False), (True, False), sources, (False, True), (True, False)):
        values = merge(SIM if source != "gateway elsewhere" else {}, sources[source])
        values = merge(values, {"serviceMonitor": {"enabled": monitor}, "diagnostics": {"enabled": diagnostics},
                                "autoscaler": {"enabled": autoscaler}})
        if not controllers:
            values = merge(values, {k: {"enabled": False} for k in CONTROLLERS})
        label = (f"serviceMonitor {monitor}, diagnostics {diagnostics}, {source}, autoscaler {autoscaler}, "
                 f"controllers {controllers}")
        unverifiable = monitor and not diagnostics and controllers
        refused_autoscaler = autoscaler and source == "existingSecret"
        try:
            render(values)
            c.expect(not unverifiable, f"{label}: the controllers' self-signed admin ports must not be monitored")
        except helm.HelmError as e:
            if refused_autoscaler:
                c.expect("gateway.tls.source" in str(e), f"{label}: the refusal says what to set: {e}")
            else:
                c.expect(unverifiable and "diagnostics.enabled=true" in str(e) and "serviceMonitor.enabled" in str(e),
                         f"{label}: refused only where no CA could be verified, saying what to set: {e}")
    c.expect(not SKIPPED_VERIFICATION, f"no render names insecureSkipVerify: {SKIPPED_VERIFICATION}")


def check() -> int:
    c = Checks()

    report = helm.lint(str(CHART), SIM, strict=True, kube_version="v1.33.0", namespace=NAMESPACE)
    problems = [m for m in report.get("messages", []) if m["severity"] >= 2] + report.get("errors", [])
    c.expect(not problems, f"helm lint --strict: {problems}")

    defaults = render_sim()
    validate_all(c, defaults, "defaults")
    k = kinds(defaults)
    c.expect(len(k.get("Deployment", [])) == 4, f"4 Deployments by default, got {k.get('Deployment')}")
    c.expect(len(k.get("ServiceAccount", [])) == 4, "one ServiceAccount per component")
    c.expect(len(k.get("PodDisruptionBudget", [])) == 4, "one PDB per component")
    c.expect(k.get("NetworkPolicy") == ["ccm-gateway"], "a NetworkPolicy in front of the gateway")
    c.expect("ServiceMonitor" not in k, "no ServiceMonitor unless asked")
    c.expect(sorted(k.get("Secret", [])) == ["ccm-diagnostics-tls", "ccm-gateway-tls"],
             "the gateway's and the diagnostics API's TLS Secrets, and no other without credentials")

    # kubectl ccm's viewer roles: there by default, bound only to whom the
    # values name, reading the diagnostics API and never through a proxy.
    c.expect("ccm-viewer" in k.get("ClusterRole", []) and "ccm-viewer" in k.get("Role", []),
             "the viewer roles exist by default")
    c.expect("ccm-viewer" not in k.get("ClusterRoleBinding", []) + k.get("RoleBinding", []),
             "nobody is bound to the viewer roles unless named")
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in defaults}
    c.expect(by_name[("ClusterRole", "ccm-viewer")]["rules"] == VIEWER_CLUSTER_RULES,
             f"the viewer reads Services, Nodes, Events and the diagnoses cluster-wide, nothing else: "
             f"{by_name[('ClusterRole', 'ccm-viewer')]['rules']}")
    c.expect(by_name[("Role", "ccm-viewer")]["rules"] == VIEWER_RULES,
             f"the viewer reads the Leases and the components in the release's namespace, nothing else: "
             f"{by_name[('Role', 'ccm-viewer')]['rules']}")
    gateway_ports = {p["name"] for p in by_name[("Service", "ccm-gateway")]["spec"]["ports"]}
    c.expect(gateway_ports == {"grpc", "admin"}, f"the gateway Service serves grpc and admin: {gateway_ports}")
    bound = kinds(render_sim({"viewer": {"subjects": [{"kind": "Group", "name": "sre"}]}}))
    c.expect("ccm-viewer" in bound.get("ClusterRoleBinding", []) and "ccm-viewer" in bound.get("RoleBinding", []),
             "viewer.subjects binds both roles")
    c.expect("ccm-viewer" not in kinds(render_sim({"viewer": {"create": False}})).get("Role", []),
             "viewer.create=false leaves the roles out")

    check_diagnostics(c, defaults)
    check_admin(c, defaults)
    check_autoscaler(c)
    check_volumes(c)
    check_upgrade(c)

    # Bootstrap and hardening, in every pod.
    for d, ctr in containers(defaults):
        pod = d["spec"]["template"]["spec"]
        name = d["metadata"]["name"]
        keys = {t.get("key") for t in pod.get("tolerations", [])}
        for taint in ("node.cloudprovider.kubernetes.io/uninitialized", "node.kubernetes.io/not-ready",
                      "node-role.kubernetes.io/control-plane"):
            c.expect(taint in keys, f"{name} tolerates {taint}")
        c.expect(pod.get("priorityClassName") == "system-cluster-critical", f"{name} is system-cluster-critical")
        c.expect(pod["securityContext"].get("runAsNonRoot") is True, f"{name} runs as non-root")
        sc = ctr["securityContext"]
        c.expect(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False,
                 f"{name}: read-only root, no privilege escalation")
        c.expect({p["path"] for p in (ctr["livenessProbe"]["httpGet"], ctr["readinessProbe"]["httpGet"])}
                 == {"/livez", "/readyz"}, f"{name} probes the admin endpoints")
        args = " ".join(ctr.get("args", []))
        if name != "ccm-gateway":
            c.expect("--gateway-address=https://$(CCM_GATEWAY_SERVICE_HOST):7400" in args,
                     f"{name} finds the gateway without cluster DNS: {args}")
            c.expect("--gateway-ca-file=/etc/cloud-gateway/ca/ca.crt" in args
                     and "--gateway-server-name=ccm-gateway.kube-system.svc" in args,
                     f"{name} verifies the gateway's certificate by the Service's name: {args}")
            ca = [v for v in pod["volumes"] if v["name"] == "gateway-ca"]
            c.expect(bool(ca) and ca[0]["secret"] == {"secretName": "ccm-gateway-tls",
                                                      "items": [{"key": "ca.crt", "path": "ca.crt"}]},
                     f"{name} mounts the CA of the gateway's Secret, not its key: {ca}")
            c.expect("--leader-elect=true" in args, f"{name} elects a leader by default")
            token = [v for v in pod["volumes"] if v["name"] == "gateway-token"]
            c.expect(bool(token) and token[0]["projected"]["sources"][0]["serviceAccountToken"]["audience"]
                     == "cloud-gateway", f"{name} gets an audience-bound token")
        else:
            c.expect("--service-account-roles=kube-system/ccm-node-controller=node,"
                     "kube-system/ccm-service-controller=service,kube-system/ccm-route-controller=route" in args,
                     f"the gateway maps the controllers' ServiceAccounts to roles: {args}")
            c.expect("--tls-cert=/etc/cloud-gateway/tls/tls.crt" in args and "--tls-key=/etc/cloud-gateway/tls/tls.key" in args
                     and "--insecure-plaintext" not in args, f"the gateway serves gRPC over TLS: {args}")
            tls = [v for v in pod["volumes"] if v["name"] == "tls"]
            c.expect(bool(tls) and tls[0]["secret"]["secretName"] == "ccm-gateway-tls"
                     and not any("subPath" in m for m in ctr["volumeMounts"]),
                     "the gateway mounts its TLS Secret whole (no subPath), so renewals reach it")
    secret = by_name[("Secret", "ccm-gateway-tls")]
    c.expect(secret["type"] == "kubernetes.io/tls" and set(secret["stringData"]) == {"tls.crt", "tls.key", "ca.crt"}
             and "BEGIN CERTIFICATE" in secret["stringData"]["ca.crt"],
             "the chart-made Secret holds the certificate, its key and the CA")

    # The other two sources of the certificate, and mutual TLS.
    cm = render_sim({"gateway": {"tls": {"source": "cert-manager", "issuerRef": {"kind": "ClusterIssuer", "name": "ca"}}}})
    validate_all(c, cm, "cert-manager")
    cert = next((d for d in cm if d["kind"] == "Certificate"), None)
    c.expect(cert is not None and cert["spec"]["secretName"] == "ccm-gateway-tls"
             and "ccm-gateway.kube-system.svc" in cert["spec"]["dnsNames"]
             and cert["spec"]["issuerRef"] == {"name": "ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
             and "Secret" not in kinds(cm), "cert-manager: a Certificate into the gateway's Secret, no chart-made one")
    own = render_sim({"gateway": {"tls": {"source": "existingSecret", "existingSecret": "my-gateway-tls"}},
                      "diagnostics": {"tls": {"existingSecret": "my-diagnostics-tls", "caBundle": DIAGNOSTICS_CA}}})
    c.expect("Secret" not in kinds(own) and all(
        any(v.get("secret", {}).get("secretName") == "my-gateway-tls" for v in d["spec"]["template"]["spec"]["volumes"])
        for d, _ in containers(own)), "existingSecret: every pod mounts the Secret named, none is made")
    mtls = render_sim({"gateway": {"tls": {"clientCA": {"existingSecret": "client-ca"}, "clientCertRoles": [
        {"identity": "spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler", "role": "autoscaler"}]}}})
    validate_all(c, mtls, "mutual TLS")
    gw = next(ctr for d, ctr in containers(mtls) if d["metadata"]["name"] == "ccm-gateway")
    c.expect("--tls-client-ca=/etc/cloud-gateway/client-ca/ca.crt" in gw["args"]
             and "--client-cert-roles=spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler=autoscaler"
             in gw["args"] and "--cluster-name=kubernetes" in gw["args"],
             f"mutual TLS: the client CA and the identities' roles reach the gateway: {gw['args']}")

    # Each component off on its own.
    for key, component in COMPONENTS.items():
        # Without the gateway there is no provider to name.
        docs = render(GATEWAY_ELSEWHERE if key == "gateway"
                      else merge(SIM, deep_set({}, f"{key}.enabled", False)))
        validate_all(c, docs, f"{key} off")
        names = [d["metadata"]["name"] for d in docs]
        c.expect(f"ccm-{component}" not in [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"],
                 f"{key}.enabled=false renders no {component} Deployment")
        c.expect(not any(n == f"ccm-{component}" for n, d in zip(names, docs) if d["kind"] in
                         ("ServiceAccount", "ClusterRole")), f"{key}.enabled=false renders no RBAC for it")
        c.expect(not any(s.get("name") == f"ccm-{component}" for d in docs for s in d.get("subjects", [])),
                 f"{key}.enabled=false binds no role to its ServiceAccount")
        c.expect(len([d for d in docs if d["kind"] == "Deployment"]) == 3, f"{key} off leaves 3 Deployments")
    off = render(GATEWAY_ELSEWHERE)
    c.expect(all("--gateway-address=https://10.0.0.10:7400" in ctr["args"]
                 and "--gateway-ca-file=/etc/cloud-gateway/ca/ca.crt" in ctr["args"]
                 and not any(a.startswith("--gateway-server-name") for a in ctr["args"]) for _, ctr in containers(off)),
             "controllers use gateway.address and the CA of gateway.tls.existingSecret when the gateway is elsewhere")

    # The admin ports: anyone by default (nothing secret there), only the
    # sources listed once some are, and the controllers, which read them
    # to answer the diagnostics API.
    open_admin = by_name[("NetworkPolicy", "ccm-gateway")]["spec"]["ingress"][1]
    c.expect("from" not in open_admin and "ccm-controllers" not in k.get("NetworkPolicy", []),
             "admin ports open to anyone by default")
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    limited = render_sim({"networkPolicy": {"adminSources": monitoring}})
    validate_all(c, limited, "admin sources")
    policies = {d["metadata"]["name"]: d for d in limited if d["kind"] == "NetworkPolicy"}
    ingress = lambda name: policies.get(name, {}).get("spec", {}).get("ingress", [])
    c.expect(len(ingress("ccm-gateway")) == 2 and ingress("ccm-gateway")[1].get("from") == monitoring + [CONTROLLER_PEER]
             and len(ingress("ccm-controllers")) == 2
             and ingress("ccm-controllers")[0] == {"ports": [{"port": "admin", "protocol": "TCP"}],
                                                   "from": monitoring + [CONTROLLER_PEER]},
             f"networkPolicy.adminSources limits every admin port to those and the controllers: {sorted(policies)}")
    c.expect(ingress("ccm-controllers")[1:] == [{"ports": [{"port": "diagnostics", "protocol": "TCP"}]}],
             f"the diagnostics port is open to any source (kube-apiserver): {ingress('ccm-controllers')}")
    plain = render_sim({"networkPolicy": {"adminSources": monitoring}, "diagnostics": {"enabled": False}})
    policies = {d["metadata"]["name"]: d for d in plain if d["kind"] == "NetworkPolicy"}
    c.expect(ingress("ccm-gateway")[1].get("from") == monitoring
             and ingress("ccm-controllers") == [{"ports": [{"port": "admin", "protocol": "TCP"}], "from": monitoring}],
             f"diagnostics off: the admin ports admit only the sources listed, no diagnostics port: {policies}")

    # Options.
    opts = render_sim({
        "hostNetwork": True,
        "serviceMonitor": {"enabled": True},
        "gateway": {"credentials": {"data": {"key.json": "{}"}}, "config": {"cache-ttl": "30s"}},
        "nodeController": {"config": {"concurrent-node-syncs": 64}, "extraArgs": ["--lookup-batch-size=50"]},
        "networkPolicy": {"extraClients": [{"namespaceSelector": {"matchLabels": {"team": "tools"}}}]},
    })
    validate_all(c, opts, "options")
    k = kinds(opts)
    c.expect(sorted(k.get("Secret", [])) == ["ccm-diagnostics-tls", "ccm-gateway-credentials", "ccm-gateway-tls"],
             "credentials data makes a Secret")
    c.expect(sorted(k.get("ServiceMonitor", [])) == ["ccm-controllers", "ccm-gateway"] and len(k.get("Service", [])) == 6,
             "serviceMonitor.enabled adds a ServiceMonitor per admin certificate and a metrics Service per component")
    for d, ctr in containers(opts):
        pod = d["spec"]["template"]["spec"]
        c.expect(pod.get("hostNetwork") is True and pod.get("dnsPolicy") == "ClusterFirstWithHostNet",
                 f"{d['metadata']['name']} on the host network")
        mounts = [m["mountPath"] for m in ctr.get("volumeMounts", [])]
        creds = "/etc/cloud-gateway/credentials" in mounts
        c.expect(creds == (d["metadata"]["name"] == "ccm-gateway"), "credentials are mounted into the gateway only")
        if d["metadata"]["name"] == "ccm-node-controller":
            c.expect("--concurrent-node-syncs=64" in ctr["args"] and "--lookup-batch-size=50" in ctr["args"],
                     "config and extraArgs reach the node controller")
    # Traces: every component exports to the collector named.
    traced = render_sim({"tracing": {"otlpEndpoint": "http://otel-collector.monitoring:4317"}})
    c.expect(all("--otlp-endpoint=http://otel-collector.monitoring:4317" in ctr["args"] for _, ctr in containers(traced))
             and len(list(containers(traced))) == 4, "tracing.otlpEndpoint reaches all four components")
    c.expect(not any("--otlp-endpoint" in " ".join(ctr["args"]) for _, ctr in containers(render_sim())),
             "no trace export by default")

    # Monitoring: the dashboard for Grafana's sidecar and the alert rules.
    mon = render_sim({"grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Kubernetes"}},
                      "prometheusRule": {"enabled": True, "labels": {"release": "prom"}}})
    validate_all(c, mon, "monitoring")
    dash = next((d for d in mon if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ccm-dashboard"), None)
    c.expect(dash is not None and dash["metadata"]["labels"].get("grafana_dashboard") == "1"
             and dash["metadata"].get("annotations", {}).get("grafana_folder") == "Kubernetes",
             "grafanaDashboard.enabled adds a ConfigMap with the sidecar's label")
    queries = dashboard_queries(mon)
    c.expect(len(queries) >= 20 and all(q.strip() for q in queries), f"the dashboard parses, {len(queries)} queries")
    rule = next((d for d in mon if d["kind"] == "PrometheusRule"), None)
    c.expect(rule is not None and rule["metadata"]["labels"].get("release") == "prom",
             "prometheusRule.enabled adds a PrometheusRule with its labels")
    c.expect("ConfigMap" not in kinds(render_sim()) and "PrometheusRule" not in kinds(render_sim()),
             "no dashboard and no rules by default")
    partial = render_sim({"prometheusRule": {"enabled": True}, "routeController": {"enabled": False}})
    c.expect(not any("route_controller" in q or "ccm-route-controller" in q for q in rule_queries(partial)),
             "no alert watches a controller that is not installed")
    existing = render_sim({"gateway": {"credentials": {"existingSecret": "cloud-keys"}}})
    gw = next(d for d in existing if d["kind"] == "Deployment" and d["metadata"]["name"] == "ccm-gateway")
    c.expect(any(v.get("secret", {}).get("secretName") == "cloud-keys" for v in gw["spec"]["template"]["spec"]["volumes"])
             and sorted(kinds(existing).get("Secret", [])) == ["ccm-diagnostics-tls", "ccm-gateway-tls"],
             "an existing Secret is mounted, none created")

    # The AWS provider: its flags, credentials from a Secret's file, IRSA.
    aws_values = {"gateway": {"provider": "aws", "replicas": 2, "aws": {
        "region": "eu-west-1", "vpcID": "vpc-0abc", "routeTableIDs": ["rtb-1", "rtb-2"],
        "roleARN": "arn:aws:iam::123456789012:role/ccm", "defaultLoadBalancerType": "nlb"},
        "credentials": {"existingSecret": "aws-keys"}}}
    aws = render(aws_values)
    validate_all(c, aws, "aws")
    gw = next(ctr for d, ctr in containers(aws) if d["metadata"]["name"] == "ccm-gateway")
    for flag in ("--provider=aws", "--aws-region=eu-west-1", "--aws-vpc-id=vpc-0abc",
                 "--aws-route-table-ids=rtb-1,rtb-2", "--aws-role-arn=arn:aws:iam::123456789012:role/ccm",
                 "--aws-default-load-balancer-type=nlb"):
        c.expect(flag in gw["args"], f"the AWS gateway gets {flag}: {gw['args']}")
    c.expect({"name": "AWS_SHARED_CREDENTIALS_FILE", "value": "/etc/cloud-gateway/credentials/credentials"}
             in gw.get("env", []), "the SDK reads the mounted credentials file")
    for d, ctr in containers(aws):
        if d["metadata"]["name"] != "ccm-gateway":
            c.expect(not any(e["name"].startswith("AWS_") for e in ctr.get("env", [])),
                     f"{d['metadata']['name']} gets no AWS settings")
    names = lambda objs, kind: {d["metadata"]["name"] for d in objs if d["kind"] == kind}
    for kind in ("Deployment", "ServiceAccount", "PodDisruptionBudget"):
        c.expect("ccm-route-controller" not in names(aws, kind),
                 f"no route controller {kind} on AWS unless asked (VPC CNI routes pods)")
    knobs = render({"gateway": {"provider": "aws", "aws": {
        "region": "eu-west-1", "disableSecurityGroupIngress": True, "elbSecurityGroup": "sg-0abc",
        "nlbSecurityGroupMode": "none", "clusterHealthProbe": "shared", "sharedHealthProbePort": 10257,
        "endpoints": {"sts": "https://sts.example", "ec2": "https://ec2.example"}}}})
    validate_all(c, knobs, "aws knobs")
    gw = next(ctr for d, ctr in containers(knobs) if d["metadata"]["name"] == "ccm-gateway")
    for flag in ("--aws-disable-security-group-ingress=true", "--aws-elb-security-group=sg-0abc",
                 "--aws-nlb-security-group-mode=none", "--aws-cluster-health-probe=shared",
                 "--aws-shared-health-probe-port=10257", "--aws-shared-health-probe-path=/healthz",
                 "--aws-endpoints=ec2=https://ec2.example,sts=https://sts.example"):
        c.expect(flag in gw["args"], f"the AWS knobs reach the gateway as {flag}: {gw['args']}")
    gw = next(ctr for d, ctr in containers(aws) if d["metadata"]["name"] == "ccm-gateway")
    c.expect(not any(a.startswith(("--aws-disable", "--aws-cluster-health", "--aws-endpoints="))
                     for a in gw["args"]), f"the knobs' defaults add no flags: {gw['args']}")
    tagged = render({**aws_values, "nodeController": {"instanceTags": {"team": "ml", "cost": "42", "note": "a: b"}}})
    node = next(ctr for d, ctr in containers(tagged) if d["metadata"]["name"] == "ccm-node-controller")
    c.expect("--instance-tags=cost=42,note=a: b,team=ml" in node["args"],
             f"instance tags reach the node controller as one argument: {node['args']}")
    node = next(ctr for d, ctr in containers(aws) if d["metadata"]["name"] == "ccm-node-controller")
    c.expect(not any(a.startswith("--instance-tags") for a in node["args"]), "no tagging unless asked")
    approving = render_sim({"nodeController": {"approveKubeletServingCSRs": True}})
    node = next(ctr for d, ctr in containers(approving) if d["metadata"]["name"] == "ccm-node-controller")
    c.expect("--approve-kubelet-serving-csrs=true" in node["args"], f"the approver is asked for: {node['args']}")
    role = next(d for d in approving if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "ccm-node-controller")
    signers = [r for r in role["rules"] if r["resources"] == ["signers"]]
    c.expect(signers == [{"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
                          "resourceNames": ["kubernetes.io/kubelet-serving"], "verbs": ["approve"]}],
             f"approve on the kubelet-serving signer only: {signers}")
    plain = next(d for d in render_sim({}) if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "ccm-node-controller")
    c.expect(not any("certificates.k8s.io" in r["apiGroups"] for r in plain["rules"]), "no CSR rights unless asked")
    routed = render({**aws_values, "routeController": {"enabled": True}})
    c.expect("ccm-route-controller" in names(routed, "Deployment"),
             "routeController.enabled=true runs it on AWS")
    c.expect("ccm-route-controller" in names(render_sim({}), "Deployment"),
             "the route controller runs by default on the sim")
    irsa = render({"gateway": {"provider": "aws", "aws": {"region": "us-east-1"},
                               "serviceAccount": {"annotations": {
                                   "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/ccm"}}}})
    validate_all(c, irsa, "aws with IRSA")
    sas = {d["metadata"]["name"]: d for d in irsa if d["kind"] == "ServiceAccount"}
    c.expect(sas["ccm-gateway"]["metadata"].get("annotations", {}).get("eks.amazonaws.com/role-arn")
             == "arn:aws:iam::123456789012:role/ccm", "IRSA annotates the gateway's ServiceAccount")
    c.expect(all("annotations" not in d["metadata"] for n, d in sas.items() if n != "ccm-gateway"),
             "only the gateway's ServiceAccount is annotated")
    gw = next(ctr for d, ctr in containers(irsa) if d["metadata"]["name"] == "ccm-gateway")
    c.expect(all(e["name"] != "AWS_SHARED_CREDENTIALS_FILE" for e in gw.get("env", []))
             and not any(m["mountPath"].startswith("/etc/cloud-gateway/credentials")
                                         for m in gw["volumeMounts"]),
             "with IRSA there is no credentials Secret")
    for docs, name in ((defaults, "defaults"), (irsa, "aws with IRSA")):
        c.expect(sorted(d["metadata"]["name"] for d, ctr in containers(docs)
                        if {"name": "MALLOC_ARENA_MAX", "value": "1"} in ctr.get("env", []))
                 == sorted(d["metadata"]["name"] for d, _ in containers(docs)),
                 f"{name}: the gateway and every controller run with one malloc arena")

    # The schema refuses bad values before anything is rendered.
    bad = {
        "replicas as a string": {"nodeController": {"replicas": "two"}},
        "an OTLP endpoint that is not a URL": {"tracing": {"otlpEndpoint": "collector:4317"}},
        "unknown top-level key": {"gatewy": {}},
        "unknown nested key": {"gateway": {"replica": 1}},
        "two sim gateways": {"gateway": {"provider": "sim", "replicas": 2}},
        "a bad cluster CIDR": {"routeController": {"clusterCIDR": "10.244.0.0"}},
        "extraArgs without dashes": {"serviceController": {"extraArgs": ["verbose"]}},
        "an unknown provider": {"gateway": {"provider": "aws-typo"}},
        "aws without a region": {"gateway": {"provider": "aws"}},
        "a bad VPC ID": {"gateway": {"provider": "aws", "aws": {"region": "eu-west-1", "vpcID": "vpc_1"}}},
        "an AWS flag through config": {"gateway": {"config": {"aws-region": "eu-west-1"}}},
        "a flag the chart sets": {"gateway": {"config": {"listen": "0.0.0.0:1"}}},
        "a bad log format": {"logging": {"format": "xml"}},
        "a negative budget": {"gateway": {"budget": {"rate": -1, "burst": 1}}},
        "a bad duration": {"leaderElection": {"leaseDuration": "15"}},
        "a plaintext gateway address": {"gateway": {"enabled": False, "address": "http://10.0.0.10:7400"}},
        "an unknown certificate source": {"gateway": {"tls": {"source": "vault"}}},
        "an identity that is neither a URI nor CN=": {"gateway": {"tls": {"clientCertRoles": [
            {"identity": "cluster-autoscaler", "role": "node"}]}}},
        "a diagnostics port as a string": {"routeController": {"diagnosticsPort": "7432"}},
        "a diagnostics port out of range": {"nodeController": {"diagnosticsPort": 70000}},
        "an unknown diagnostics key": {"diagnostics": {"apiservice": {"create": False}}},
        "a caBundle that is not PEM": {"diagnostics": {"tls": {"caBundle": "LS0tLS1CRUdJTg=="}}},
        "insecureSkipTLSVerify asked for": {"diagnostics": {"apiService": {"insecureSkipTLSVerify": True}}},
        "a scraper ServiceAccount without its namespace": {"metrics": {"scrapers": [
            {"kind": "ServiceAccount", "name": "prometheus-k8s"}]}},
        "a scraper that is no RBAC subject": {"metrics": {"scrapers": [{"kind": "Pod", "name": "prometheus-0"}]}},
        "an unknown metrics key": {"metrics": {"scraper": []}},
        "an admin certificate through the gateway's config": {"gateway": {"config": {"admin-tls-cert": "/x"}}},
    }
    chart = helm.Chart.load(CHART)
    for what, values in bad.items():
        try:
            chart.validate_schema(values)
            c.expect(False, f"the schema accepted {what}: {values}")
        except helm.HelmError:
            c.expect(True, what)
    for what, values, names in (
            ("a disabled gateway without gateway.address", {"gateway": {"enabled": False}}, "gateway.address"),
            ("a disabled gateway without the CA of its certificate",
             {"gateway": {"enabled": False, "address": "https://10.0.0.10:7400"}}, "gateway.tls.existingSecret"),
            ("cert-manager without an issuer", merge(SIM, {"gateway": {"tls": {"source": "cert-manager"}}}),
             "gateway.tls.issuerRef"),
            ("mutual TLS without identities", merge(SIM, {"gateway": {"tls": {"clientCA": {"existingSecret": "x"}}}}),
             "gateway.tls.clientCertRoles")):
        try:
            render(values)
            c.expect(False, f"{what} must fail to render")
        except helm.HelmError as e:
            c.expect(names in str(e), f"the render error names {names}: {e}")

    # No default provider: installed as it comes, the sim would run on a
    # real cluster and have its Nodes deleted. An unknown one fails in the
    # schema and, with the schema skipped, in the templates.
    for what, attempt in (("no provider", lambda: render()),
                          ("an unknown provider", lambda: render({"gateway": {"provider": "cloudy"}})),
                          ("an unknown provider, schema skipped",
                           lambda: render_unchecked({"gateway": {"provider": "cloudy"}}))):
        try:
            attempt()
            c.expect(False, f"{what} must fail to render")
        except helm.HelmError as e:
            c.expect("aws" in str(e) and "sim" in str(e), f"{what}: the render error names aws and sim: {e}")
            if what != "an unknown provider":
                c.expect("throwaway cluster" in str(e), f"{what}: the render error says what sim is for: {e}")

    check_no_skipped_verification(c)

    for f in c.failures:
        print(f"FAIL {f}")
    print(f"{c.count - len(c.failures)}/{c.count} chart checks passed "
          f"(Helm {helm.helm_sdk_version()}, Kubernetes schemas {kv_utils.latest_version()})")
    return 1 if c.failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check")
    sub.add_parser("upgrade-baseline")
    r = sub.add_parser("render")
    r.add_argument("--release", default=RELEASE)
    r.add_argument("--namespace", default=NAMESPACE)
    r.add_argument("--values", "-f", action="append", default=[], help="a YAML values file (under --set)")
    r.add_argument("--set", action="append", default=[], help="dotted.key=value (YAML value)")
    args = p.parse_args()
    if args.cmd == "check":
        return check()
    if args.cmd == "upgrade-baseline":
        return upgrade_baseline()
    values: dict = {}
    for path in args.values:
        with open(path) as f:
            values = merge(values, yaml.safe_load(f) or {})
    for item in args.set:
        key, _, value = item.partition("=")
        values = deep_set(values, key, yaml.safe_load(value))
    try:
        docs = render(values, args.release, args.namespace)
    except helm.HelmError as e:
        print(f"helm/check.py render: {e}", file=sys.stderr)
        return 1
    print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
