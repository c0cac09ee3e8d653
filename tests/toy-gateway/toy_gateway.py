#!/usr/bin/env python3
"""toy-gateway: a second implementation of cloudgateway.v1, in Python.

It exists to prove the contract is language-neutral: our node, service
and route controllers run against it unchanged, and `gateway-conformance`
passes against it. Its cloud is a toy kept in memory: instances, load
balancers with addresses from 198.18.0.0/15, and routes. Nothing here is
shared with our Rust gateway; it knows the contract only from the protos
(compiled when it starts) and proto/CONTRACT.md.

usage:
  toy_gateway.py --listen 127.0.0.1:7443 --tokens-dir DIR [--proto-dir proto]
                 [--offer instances,load_balancers,routes]

`--offer` names the capabilities it backs (all three by default); the
others answer UNIMPLEMENTED, as a cloud without, say, routes would.
DIR holds one token per role, `<role>.token` for node, service, route and
admin (the files the controllers and the conformance suite read). The
admin role may also call the SimAdmin subset that serves as the
contract's test hook: CreateInstance, ListInstances, StopInstance,
StartInstance, TerminateInstance, SetInstanceAddresses, SetFaults and
GetFaults (of the faults, only `latency` and `lb_provisioning_delay`).
"""

import argparse
import ipaddress
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import any_pb2, duration_pb2, message
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_status import rpc_status

PACKAGE = "cloudgateway.v1"
PROVIDER = "toy"
REGION = "toy-1"
ZONES = ["toy-1a", "toy-1b", "toy-1c"]
# Our own annotations; any other key under the prefix is refused.
ANNOTATION_PREFIX = "toy.cloudgateway.io/"
IDLE_TIMEOUT = ANNOTATION_PREFIX + "idle-timeout"
# The services each role may call; Provider is open to every role.
ROLES = {
    "node": {"Instances"},
    "service": {"LoadBalancers"},
    "route": {"Routes"},
    "admin": {"Instances", "LoadBalancers", "Routes", "SimAdmin"},
}
# The services a provider may or may not back, by GetProviderInfo's field.
CAPABILITIES = {"Instances": "instances", "LoadBalancers": "load_balancers", "Routes": "routes"}
CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:=+@-]{0,105}$")
MAX_BATCH = 1000
# The toy cloud's own limits on a load balancer's hosts, stated in
# GetProviderInfo and refused past before anything changes.
HOSTS_PER_LOAD_BALANCER = 1000
HOSTS_PER_ZONE = 250


def compile_protos(proto_dir):
    """Compiles the protos into a temporary directory and imports them."""
    out = tempfile.mkdtemp(prefix="toy-gateway-")
    files = [
        f"cloudgateway/v1/{name}.proto"
        for name in ["common", "instances", "load_balancers", "provider", "routes", "sim_admin"]
    ]
    import grpc_tools

    includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}", f"-I{includes}",
         f"--python_out={out}", *files],
        check=True,
    )
    sys.path.insert(0, out)
    import importlib

    return {
        name: importlib.import_module(f"cloudgateway.v1.{name}_pb2")
        for name in ["common", "instances", "load_balancers", "provider", "routes", "sim_admin"]
    }


class Refused(Exception):
    """A gRPC error with the contract's details: ErrorInfo always, RetryInfo
    with a delay, BadRequest with the invalid fields."""

    def __init__(self, code, reason, message, delay=None, violations=()):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.delay, self.violations = delay, list(violations)

    def status(self):
        details = [error_details_pb2.ErrorInfo(reason=self.reason, domain=PACKAGE)]
        if self.delay is not None:
            retry = duration_pb2.Duration()
            retry.FromMilliseconds(max(1, int(self.delay * 1000)))
            details.append(error_details_pb2.RetryInfo(retry_delay=retry))
        if self.violations:
            details.append(error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in self.violations
            ]))
        packed = []
        for d in details:
            a = any_pb2.Any()
            a.Pack(d)
            packed.append(a)
        return rpc_status.to_status(status_pb2.Status(
            code=self.code.value[0], message=self.message, details=packed))


def invalid(violations):
    fields = ", ".join(f for f, _ in violations)
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT",
                   f"invalid request: {fields}", violations=violations)


def not_found(what):
    return Refused(grpc.StatusCode.NOT_FOUND, "NOT_FOUND", f"{what} does not exist")


def check_cluster(name, problems):
    if not CLUSTER_NAME.fullmatch(name):
        problems.append(("cluster_name", f"{name!r} is not a cluster name (1-106 of letters, digits and . _ - : = + @)"))


def check_service(ref, field, problems):
    if not ref.uid:
        problems.append((f"{field}.uid", "required"))
    if not ref.name or not ref.namespace:
        problems.append((field, "needs a namespace and a name"))


def require(request, service=False, more=()):
    """Refuses the request, naming every invalid field, unless its cluster
    name (and Service, with `service`) and the `more` problems are fine."""
    problems = []
    check_cluster(request.cluster_name, problems)
    if service:
        check_service(request.service, "service", problems)
    problems.extend(more)
    if problems:
        raise invalid(problems)


def seconds(duration):
    return duration.seconds + duration.nanos / 1e9


class Cloud:
    """The toy cloud: everything in memory, behind one lock."""

    def __init__(self, pb):
        self.pb = pb
        self.lock = threading.Lock()
        self.instances = {}  # id -> dict
        self.next_instance = 1
        self.lbs = {}  # (cluster, uid) -> dict
        self.next_address = 1
        self.routes = {}  # (cluster, cidr) -> dict
        self.latency = {}  # operation or "*" -> seconds
        self.provisioning = 0.0

    # ---- faults the admin hook sets

    def wait(self, operation, context):
        """Injected latency, cut short by the caller's deadline."""
        delay = self.latency.get(operation, self.latency.get("*", 0.0))
        if not delay:
            return
        remaining = context.time_remaining()
        if remaining is not None and remaining < delay:
            time.sleep(max(0.0, remaining))
            raise Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "CLOUD_UNAVAILABLE",
                          f"{operation} did not finish before the caller's deadline")
        time.sleep(delay)

    # ---- instances

    def provider_id(self, instance):
        return f"{PROVIDER}://{instance['zone']}/{instance['id']}"

    def find(self, ref):
        if ref.provider_id:
            id_ = ref.provider_id.rsplit("/", 1)[-1]
            return self.instances.get(id_)
        return next((i for i in self.instances.values() if i["name"] == ref.name), None)

    def instance_message(self, i):
        pb = self.pb["instances"]
        return pb.Instance(
            provider_id=self.provider_id(i), instance_type=i["type"], zone=i["zone"],
            region=REGION, addresses=i["addresses"], additional_labels=i["labels"])

    def sim_instance(self, i):
        pb = self.pb["sim_admin"]
        state = self.pb["instances"].INSTANCE_STATE_RUNNING if i["running"] \
            else self.pb["instances"].INSTANCE_STATE_SHUTDOWN
        return pb.SimInstance(
            id=i["id"], name=i["name"], provider_id=self.provider_id(i), instance_type=i["type"],
            zone=i["zone"], region=REGION, state=state, addresses=i["addresses"],
            labels=i["labels"])

    def route_target(self, route):
        """The instance a route sends traffic to, if it still exists."""
        if route["target_provider_id"]:
            ref = self.pb["instances"].NodeRef(provider_id=route["target_provider_id"])
        else:
            ref = self.pb["instances"].NodeRef(name=route["target_node"])
        return self.find(ref)


class Gateway:
    """The cloudgateway.v1 services over the toy cloud. Every method takes
    the request's raw bytes, so a message that does not decode is
    INVALID_ARGUMENT (grpcio's own decoding would answer INTERNAL)."""

    def __init__(self, pb, tokens, offered):
        self.pb = pb
        self.tokens = tokens
        self.offered = offered
        self.cloud = Cloud(pb)

    # ---- plumbing

    def handlers(self):
        out = []
        for module in self.pb.values():
            for service in module.DESCRIPTOR.services_by_name.values():
                methods = {}
                for method in service.methods:
                    request_type = getattr(self.pb_module(method.input_type), method.input_type.name)
                    methods[method.name] = grpc.unary_unary_rpc_method_handler(
                        self.serve(service.name, method.name, request_type),
                        request_deserializer=None,
                        response_serializer=lambda m: m.SerializeToString(),
                    )
                out.append(grpc.method_handlers_generic_handler(service.full_name, methods))
        return out

    def pb_module(self, descriptor):
        name = os.path.basename(descriptor.file.name).replace(".proto", "")
        return self.pb[name]

    def serve(self, service, method, request_type):
        implementation = getattr(self, f"{service}_{method}", None)

        def handle(raw, context):
            try:
                self.authorize(service, context)
                try:
                    request = request_type.FromString(raw)
                except message.DecodeError as e:
                    raise invalid([("", f"the request is not a valid {request_type.DESCRIPTOR.name}: {e}")])
                if implementation is None or service in CAPABILITIES and service not in self.offered:
                    raise Refused(grpc.StatusCode.UNIMPLEMENTED, "NOT_IMPLEMENTED",
                                  f"{service}.{method} is not implemented by the toy cloud")
                return implementation(request, context)
            except Refused as r:
                context.abort_with_status(r.status())

        return handle

    def authorize(self, service, context):
        header = dict(context.invocation_metadata()).get("authorization", "")
        role = self.tokens.get(header.removeprefix("Bearer ").strip()) \
            if header.startswith("Bearer ") else None
        if role is None:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED",
                          "no valid bearer token")
        if service != "Provider" and service not in ROLES[role]:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED",
                          f"the {role} role may not call {service}")

    # ---- Provider

    def Provider_GetProviderInfo(self, request, context):
        pb = self.pb["provider"]
        limits = []
        if "LoadBalancers" in self.offered:
            limits.append(pb.HostLimits(
                kind="toy", per_load_balancer=HOSTS_PER_LOAD_BALANCER,
                per_zone=HOSTS_PER_ZONE, source="the toy cloud's own"))
        return pb.GetProviderInfoResponse(
            name=PROVIDER, host_limits=limits,
            **{CAPABILITIES[s]: True for s in self.offered})

    # ---- Instances

    def Instances_GetInstances(self, request, context):
        pb = self.pb["instances"]
        problems = []
        if not 1 <= len(request.nodes) <= MAX_BATCH:
            problems.append(("nodes", f"{len(request.nodes)} nodes; send 1 to {MAX_BATCH}"))
        for n, ref in enumerate(request.nodes):
            if ref.provider_id:
                if not re.fullmatch(rf"{PROVIDER}://[a-z0-9-]+/i-[0-9]+", ref.provider_id):
                    problems.append((f"nodes[{n}].provider_id",
                                     f"{ref.provider_id!r} is not a {PROVIDER}:// provider ID"))
            elif not ref.name:
                problems.append((f"nodes[{n}]", "needs a name or a provider ID"))
        require(request, more=problems)
        self.cloud.wait("get_instances", context)
        results = []
        with self.cloud.lock:
            for ref in request.nodes:
                i = self.cloud.find(ref)
                if i is None:
                    results.append(pb.InstanceResult(node=ref, state=pb.INSTANCE_STATE_NOT_FOUND))
                else:
                    state = pb.INSTANCE_STATE_RUNNING if i["running"] else pb.INSTANCE_STATE_SHUTDOWN
                    results.append(pb.InstanceResult(
                        node=ref, state=state, instance=self.cloud.instance_message(i)))
        return pb.GetInstancesResponse(results=results)

    # ---- LoadBalancers

    def check_spec(self, request):
        problems = []
        spec = request.spec
        check_service(spec.service, "spec.service", problems)
        lb = self.pb["load_balancers"]
        if not spec.ports:
            problems.append(("spec.ports", "at least one port"))
        for n, port in enumerate(spec.ports):
            if port.protocol not in (lb.PROTOCOL_TCP, lb.PROTOCOL_UDP):
                problems.append((f"spec.ports[{n}].protocol", "the toy cloud balances TCP and UDP"))
            if not 1 <= port.port <= 65535:
                problems.append((f"spec.ports[{n}].port", "1 to 65535"))
            if not 1 <= port.node_port <= 65535:
                problems.append((f"spec.ports[{n}].node_port",
                                 "1 to 65535: the toy cloud sends traffic to node ports"))
        for n, cidr in enumerate(spec.source_ranges):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                problems.append((f"spec.source_ranges[{n}]", f"{cidr!r} is not a CIDR"))
        for key, value in sorted(spec.annotations.items()):
            if not key.startswith(ANNOTATION_PREFIX):
                continue
            field = f'spec.annotations["{key}"]'
            if key != IDLE_TIMEOUT:
                problems.append((field, f"unknown annotation; known: {IDLE_TIMEOUT}"))
            elif not (value.isdigit() and 1 <= int(value) <= 3600):
                problems.append((field, f"{value!r}: whole seconds from 1 to 3600"))
        zones = {}
        for h in request.hosts:
            if h.zone:
                zones[h.zone] = zones.get(h.zone, 0) + 1
        if len(request.hosts) > HOSTS_PER_LOAD_BALANCER:
            problems.append(("hosts", f"{len(request.hosts)} hosts exceed the toy quota of "
                                      f"{HOSTS_PER_LOAD_BALANCER} hosts per load balancer"))
        for zone, n in sorted(zones.items()):
            if n > HOSTS_PER_ZONE:
                problems.append(("hosts", f"{n} hosts in zone {zone} exceed the toy quota of "
                                          f"{HOSTS_PER_ZONE} hosts per zone"))
        require(request, more=problems)

    def lb_status(self, record):
        pb = self.pb["load_balancers"]
        if record["ready_at"] > time.monotonic():
            return pb.LoadBalancerStatus()
        return pb.LoadBalancerStatus(ingress=[pb.Ingress(ip=record["address"], ip_mode="VIP")])

    def hosts(self, hosts):
        return sorted(h.name for h in hosts)

    def LoadBalancers_GetLoadBalancer(self, request, context):
        require(request, service=True)
        self.cloud.wait("get_load_balancer", context)
        pb = self.pb["load_balancers"]
        with self.cloud.lock:
            record = self.cloud.lbs.get((request.cluster_name, request.service.uid))
            if record is None:
                return pb.GetLoadBalancerResponse(exists=False)
            return pb.GetLoadBalancerResponse(exists=True, status=self.lb_status(record))

    def LoadBalancers_EnsureLoadBalancer(self, request, context):
        self.check_spec(request)
        self.cloud.wait("ensure_load_balancer", context)
        pb = self.pb["load_balancers"]
        key = (request.cluster_name, request.spec.service.uid)
        with self.cloud.lock:
            record = self.cloud.lbs.get(key)
            if record is None:
                n = self.cloud.next_address
                self.cloud.next_address += 1
                record = {
                    "name": self.lb_name(request.cluster_name, request.spec.service.uid),
                    "service": request.spec.service,
                    "address": str(ipaddress.ip_address("198.18.0.0") + n),
                    "ready_at": time.monotonic() + self.cloud.provisioning,
                }
                self.cloud.lbs[key] = record
            record["ports"] = list(request.spec.ports)
            record["hosts"] = self.hosts(request.hosts)
            wait = record["ready_at"] - time.monotonic()
            if wait > 0:
                raise Refused(grpc.StatusCode.UNAVAILABLE, "PROVISIONING",
                              f"load balancer {record['name']} is still provisioning",
                              delay=wait)
            return pb.EnsureLoadBalancerResponse(status=self.lb_status(record))

    def lb_name(self, cluster, uid):
        """Upstream's name ("a" and 31 hex digits of the UID), or, where
        another Service's load balancer has it (UIDs alike in 31 digits),
        one of the Service's own as the Rust providers make it: 23
        characters of upstream's, "-", 8 hex digits of the UID's FNV-1a."""
        upstream = "a" + uid.replace("-", "")[:31]
        taken = {r["name"] for (c, _), r in self.cloud.lbs.items() if c == cluster}
        if upstream not in taken:
            return upstream
        h = 0xCBF29CE484222325
        for b in uid.encode():
            h = ((h ^ b) * 0x100000001B3) % 2**64
        return f"{upstream[:23]}-{(h ^ (h >> 32)) & 0xFFFFFFFF:08x}"

    def LoadBalancers_UpdateLoadBalancerHosts(self, request, context):
        self.check_spec(request)
        self.cloud.wait("update_load_balancer_hosts", context)
        with self.cloud.lock:
            record = self.cloud.lbs.get((request.cluster_name, request.spec.service.uid))
            if record is None:
                raise not_found(f"the load balancer of Service {request.spec.service.uid}")
            record["hosts"] = self.hosts(request.hosts)
        return self.pb["load_balancers"].UpdateLoadBalancerHostsResponse()

    def LoadBalancers_DeleteLoadBalancer(self, request, context):
        require(request, service=True)
        self.cloud.wait("delete_load_balancer", context)
        with self.cloud.lock:
            self.cloud.lbs.pop((request.cluster_name, request.service.uid), None)
        return self.pb["load_balancers"].DeleteLoadBalancerResponse()

    def LoadBalancers_ListLoadBalancers(self, request, context):
        require(request)
        self.cloud.wait("list_load_balancers", context)
        pb = self.pb["load_balancers"]
        with self.cloud.lock:
            return pb.ListLoadBalancersResponse(load_balancers=[
                pb.LoadBalancer(name=r["name"], service=r["service"], status=self.lb_status(r),
                                hosts=r["hosts"])
                for (cluster, _), r in sorted(self.cloud.lbs.items()) if cluster == request.cluster_name
            ])

    # ---- Routes

    def route_message(self, route):
        target = self.cloud.route_target(route)
        return self.pb["routes"].Route(
            name=route["name"], target_node=route["target_node"],
            destination_cidr=route["destination_cidr"], blackhole=target is None,
            target_provider_id=self.cloud.provider_id(target) if target else "")

    def cidr(self, value, field):
        try:
            return str(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise invalid([(field, f"{value!r} is not a CIDR")])

    def Routes_ListRoutes(self, request, context):
        require(request)
        self.cloud.wait("list_routes", context)
        with self.cloud.lock:
            return self.pb["routes"].ListRoutesResponse(routes=[
                self.route_message(r) for (cluster, _), r in sorted(self.cloud.routes.items())
                if cluster == request.cluster_name
            ])

    def Routes_CreateRoute(self, request, context):
        require(request, more=[] if request.route.target_node else [("route.target_node", "required")])
        cidr = self.cidr(request.route.destination_cidr, "route.destination_cidr")
        self.cloud.wait("create_route", context)
        with self.cloud.lock:
            key = (request.cluster_name, cidr)
            existing = self.cloud.routes.get(key)
            if existing is not None and existing["target_node"] != request.route.target_node:
                raise Refused(grpc.StatusCode.ALREADY_EXISTS, "CONFLICT",
                              f"{cidr} already goes to node {existing['target_node']}")
            if existing is None:
                existing = {
                    "name": f"{request.cluster_name}-{re.sub('[^0-9a-z]', '-', cidr)}",
                    "target_node": request.route.target_node,
                    "target_provider_id": request.route.target_provider_id,
                    "destination_cidr": cidr,
                }
                if self.cloud.route_target(existing) is None:
                    raise not_found(f"the instance of node {request.route.target_node}")
                self.cloud.routes[key] = existing
            return self.pb["routes"].CreateRouteResponse(route=self.route_message(existing))

    def Routes_DeleteRoute(self, request, context):
        require(request)
        cidr = self.cidr(request.route.destination_cidr, "route.destination_cidr")
        self.cloud.wait("delete_route", context)
        with self.cloud.lock:
            self.cloud.routes.pop((request.cluster_name, cidr), None)
        return self.pb["routes"].DeleteRouteResponse()

    # ---- SimAdmin: the contract's test hook (admin role only)

    def instance_by_id(self, id_):
        i = self.cloud.instances.get(id_.rsplit("/", 1)[-1]) or next(
            (i for i in self.cloud.instances.values() if i["name"] == id_), None)
        if i is None:
            raise not_found(f"instance {id_!r}")
        return i

    def SimAdmin_CreateInstance(self, request, context):
        common = self.pb["common"]
        if not request.name or len(request.name) > 253:
            raise invalid([("name", "1 to 253 characters")])
        with self.cloud.lock:
            if any(i["name"] == request.name for i in self.cloud.instances.values()):
                raise Refused(grpc.StatusCode.ALREADY_EXISTS, "CONFLICT",
                              f"an instance named {request.name!r} exists")
            n = self.cloud.next_instance
            self.cloud.next_instance += 1
            addresses = list(request.addresses) or [
                common.NodeAddress(type=common.NODE_ADDRESS_TYPE_HOSTNAME, address=request.name),
                common.NodeAddress(type=common.NODE_ADDRESS_TYPE_INTERNAL_IP,
                                   address=str(ipaddress.ip_address("10.0.0.0") + n)),
            ]
            instance = {
                "id": f"i-{n:06d}", "name": request.name,
                "type": request.instance_type or "toy.small",
                "zone": request.zone or ZONES[n % len(ZONES)],
                "addresses": addresses, "labels": dict(request.labels), "running": True,
            }
            self.cloud.instances[instance["id"]] = instance
            return self.cloud.sim_instance(instance)

    def SimAdmin_ListInstances(self, request, context):
        with self.cloud.lock:
            return self.pb["sim_admin"].ListInstancesResponse(instances=[
                self.cloud.sim_instance(i) for _, i in sorted(self.cloud.instances.items())])

    def set_running(self, request, running):
        with self.cloud.lock:
            i = self.instance_by_id(request.id)
            i["running"] = running
            return self.cloud.sim_instance(i)

    def SimAdmin_StopInstance(self, request, context):
        return self.set_running(request, False)

    def SimAdmin_StartInstance(self, request, context):
        return self.set_running(request, True)

    def SimAdmin_TerminateInstance(self, request, context):
        with self.cloud.lock:
            del self.cloud.instances[self.instance_by_id(request.id)["id"]]
        return self.pb["sim_admin"].TerminateInstanceResponse()

    def SimAdmin_SetInstanceAddresses(self, request, context):
        if not request.addresses:
            raise invalid([("addresses", "at least one")])
        with self.cloud.lock:
            i = self.instance_by_id(request.id)
            i["addresses"] = list(request.addresses)
            return self.cloud.sim_instance(i)

    def SimAdmin_SetFaults(self, request, context):
        unsupported = [
            (field.name, "the toy cloud injects only latency and lb_provisioning_delay")
            for field, _ in request.ListFields()
            if field.name not in ("latency", "lb_provisioning_delay")
        ]
        if unsupported:
            raise invalid(unsupported)
        with self.cloud.lock:
            self.cloud.latency = {k: seconds(v) for k, v in request.latency.items()}
            self.cloud.provisioning = seconds(request.lb_provisioning_delay)
        return self.SimAdmin_GetFaults(None, context)

    def SimAdmin_GetFaults(self, request, context):
        faults = self.pb["sim_admin"].Faults()
        with self.cloud.lock:
            for k, v in self.cloud.latency.items():
                faults.latency[k].FromNanoseconds(int(v * 1e9))
            faults.lb_provisioning_delay.FromNanoseconds(int(self.cloud.provisioning * 1e9))
        return faults


def reflection_v1(servicer):
    """grpcio-reflection serves only v1alpha; v1 has the same messages under
    another name, so the same servicer answers both."""
    return grpc.method_handlers_generic_handler("grpc.reflection.v1.ServerReflection", {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
    })


def read_tokens(directory):
    tokens = {}
    for role in ROLES:
        path = os.path.join(directory, f"{role}.token")
        if os.path.exists(path):
            with open(path) as f:
                token = f.read().strip()
            if token:
                tokens[token] = role
    if not tokens:
        raise SystemExit(f"no <role>.token files in {directory}")
    return tokens


def main():
    parser = argparse.ArgumentParser(description="A toy cloudgateway.v1 gateway in Python.")
    parser.add_argument("--listen", default="127.0.0.1:7443")
    parser.add_argument("--tokens-dir", required=True)
    parser.add_argument("--offer", default="instances,load_balancers,routes")
    # TLS, as the controllers require off this machine; read once (a real
    # gateway reads renewed files again).
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--proto-dir",
                        default=os.path.join(os.path.dirname(__file__), "..", "..", "proto"))
    args = parser.parse_args()

    pb = compile_protos(args.proto_dir)
    wanted = {c.strip() for c in args.offer.split(",") if c.strip()}
    offered = {s for s, c in CAPABILITIES.items() if c in wanted}
    if wanted - set(CAPABILITIES.values()):
        raise SystemExit(f"--offer: unknown {sorted(wanted - set(CAPABILITIES.values()))}")
    gateway = Gateway(pb, read_tokens(args.tokens_dir), offered)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=32),
        options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
    )
    server.add_generic_rpc_handlers(gateway.handlers())
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    served = [f"{PACKAGE}.{s}" for s in ["Provider", *sorted(offered)]]
    for name in ["", *served]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    names = [*served, health.SERVICE_NAME, reflection.SERVICE_NAME,
             "grpc.reflection.v1.ServerReflection"]
    reflection.enable_server_reflection(names, server)
    server.add_generic_rpc_handlers([reflection_v1(reflection.ReflectionServicer(names))])
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together")
    if args.tls_cert:
        with open(args.tls_cert, "rb") as cert, open(args.tls_key, "rb") as key:
            credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
        port = server.add_secure_port(args.listen, credentials)
    else:
        host = args.listen.rsplit(":", 1)[0].strip("[]")
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise SystemExit(f"--listen {args.listen}: in clear only on loopback; give --tls-cert and --tls-key")
        port = server.add_insecure_port(args.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {args.listen}")
    server.start()
    print(f"toy-gateway listening on {args.listen}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=2).wait()


if __name__ == "__main__":
    main()
