#!/usr/bin/env python3
"""Cluster Autoscaler's side of the external gRPC cloud provider, for tests.

Its stubs are generated when it starts, from the vendored proto
(proto/third_party/externalgrpc/externalgrpc.proto), with grpcio-tools: it
has none of our code. It reads the cloud-config a cluster-autoscaler with
`--cloud-provider=externalgrpc` reads (address, cert, key, cacert,
grpc_timeout) and dials as that client does: mutual TLS, the server name
the host part of the address.

usage: [AUTOSCALER_CONNECT_TO=HOST:PORT] autoscaler_client.py CLOUD_CONFIG STEP [STEP...]
A step is one RPC, as JSON: {"rpc": "NodeGroupIncreaseSize", "request":
{"id": "workers", "delta": 2}}. Prints one JSON line per step: {"ok":
<the answer as JSON>} or {"code": "<status code name>", "details": ...}.
"""

import json
import os
import subprocess
import sys
import tempfile

import grpc
from google.protobuf import json_format

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "..", "..", "proto", "third_party")
PROTO = "externalgrpc/externalgrpc.proto"
SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"


def compile_proto():
    """Generates the message and stub modules into a temporary directory."""
    import grpc_tools

    out = tempfile.mkdtemp(prefix="autoscaler-client-")
    includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{includes}",
         f"--python_out={out}", f"--grpc_python_out={out}", PROTO],
        check=True,
    )
    sys.path.insert(0, out)
    import importlib

    return (importlib.import_module("externalgrpc.externalgrpc_pb2"),
            importlib.import_module("externalgrpc.externalgrpc_pb2_grpc"))


def read_config(path):
    """The cloud-config's keys (flat YAML, as the chart and sandbox write it)."""
    config = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or ":" not in line:
                continue
            key, value = line.split(":", 1)
            config[key.strip()] = value.strip().strip('"')
    return config


def seconds(duration):
    """A metav1 Duration of whole seconds or milliseconds ("30s", "500ms")."""
    if duration.endswith("ms"):
        return float(duration[:-2]) / 1000
    if duration.endswith("s"):
        return float(duration[:-1])
    if duration.endswith("m"):
        return float(duration[:-1]) * 60
    raise ValueError(f"{duration!r} is not a duration this client reads")


def channel(config):
    address = config["address"]
    if not config.get("cert"):
        return grpc.insecure_channel(address)
    read = lambda key: open(config[key], "rb").read()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("cacert"),
        private_key=read("key"),
        certificate_chain=read("cert"),
    )
    host = address.rsplit(":", 1)[0].strip("[]")
    # AUTOSCALER_CONNECT_TO dials another address (a test's loopback port
    # for a cluster Service's name), still verifying the name of `address`.
    dial = os.environ.get("AUTOSCALER_CONNECT_TO") or address
    return grpc.secure_channel(
        dial, credentials, options=[("grpc.ssl_target_name_override", host)]
    )


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    pb2, pb2_grpc = compile_proto()
    config = read_config(sys.argv[1])
    timeout = seconds(config.get("grpc_timeout", "5s"))
    stub = pb2_grpc.CloudProviderStub(channel(config))
    for step in sys.argv[2:]:
        step = json.loads(step)
        rpc = step["rpc"]
        method = getattr(stub, rpc)
        request_type = pb2.DESCRIPTOR.services_by_name["CloudProvider"].methods_by_name[rpc].input_type
        request = getattr(pb2, request_type.name)()
        json_format.ParseDict(step.get("request", {}), request)
        try:
            answer = method(request, timeout=timeout)
            print(json.dumps({"ok": json_format.MessageToDict(answer)}), flush=True)
        except grpc.RpcError as e:
            print(json.dumps({"code": e.code().name, "details": e.details()}), flush=True)


if __name__ == "__main__":
    main()
