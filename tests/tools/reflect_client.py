#!/usr/bin/env python3
"""A gRPC client that knows nothing of cloudgateway.v1 beforehand.

It learns the API through server reflection, as grpcurl does, builds the
message types from the descriptors the server sends, and calls a method.
Tests use it to prove a client with none of our code can use the gateway.

usage (ADDR is host:port; --ca-file FILE speaks TLS, trusting that CA):
  reflect_client.py ADDR list
  reflect_client.py ADDR describe SERVICE
  reflect_client.py ADDR health [SERVICE]
  reflect_client.py ADDR call SERVICE/METHOD JSON [--token-file FILE] [--reflection v1|v1alpha]
Prints JSON on stdout. A failed call prints {"code": ..., "details": ...}
and exits 3.
"""

import json
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as v1alpha_grpc



class Reflection:
    def __init__(self, channel, version):
        # grpcio-reflection ships only the v1alpha client; v1 has the same
        # messages under another service name, so call its path directly.
        self.pb2 = v1alpha_pb2
        if version == "v1":
            self.info = channel.stream_stream(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                request_serializer=v1alpha_pb2.ServerReflectionRequest.SerializeToString,
                response_deserializer=v1alpha_pb2.ServerReflectionResponse.FromString,
            )
        else:
            self.info = v1alpha_grpc.ServerReflectionStub(channel).ServerReflectionInfo
        self.pool = descriptor_pool.DescriptorPool()
        self.seen = set()

    def ask(self, **kwargs):
        request = self.pb2.ServerReflectionRequest(**kwargs)
        (response,) = list(self.info(iter([request]), timeout=10))
        if response.HasField("error_response"):
            raise SystemExit(f"reflection error: {response.error_response.error_message}")
        return response

    def services(self):
        response = self.ask(list_services="")
        return sorted(s.name for s in response.list_services_response.service)

    def _add(self, file_descriptor_protos):
        protos = []
        for raw in file_descriptor_protos:
            fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
            if fd.name not in self.seen:
                self.seen.add(fd.name)
                protos.append(fd)
        # Add in dependency order.
        pending = {fd.name: fd for fd in protos}
        while pending:
            progressed = False
            for name, fd in list(pending.items()):
                if all(dep in self.seen and dep not in pending for dep in fd.dependency):
                    self.pool.Add(fd)
                    del pending[name]
                    progressed = True
            if not progressed:
                for dep in {d for fd in pending.values() for d in fd.dependency if d not in self.seen}:
                    self._add(self.ask(file_by_filename=dep).file_descriptor_response.file_descriptor_proto)
                    progressed = True
                if not progressed:
                    raise SystemExit(f"unresolvable descriptors: {sorted(pending)}")

    def service(self, name):
        response = self.ask(file_containing_symbol=name)
        self._add(response.file_descriptor_response.file_descriptor_proto)
        return self.pool.FindServiceByName(name)


def main(argv):
    addr, verb, rest = argv[1], argv[2], argv[3:]
    token_file, version = None, "v1"
    if "--token-file" in rest:
        i = rest.index("--token-file")
        token_file = rest[i + 1]
        del rest[i : i + 2]
    if "--reflection" in rest:
        i = rest.index("--reflection")
        version = rest[i + 1]
        del rest[i : i + 2]
    if "--ca-file" in rest:
        i = rest.index("--ca-file")
        with open(rest[i + 1], "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        del rest[i : i + 2]
        channel = grpc.secure_channel(addr, credentials)
    else:
        channel = grpc.insecure_channel(addr)
    if verb == "health":
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=rest[0] if rest else ""), timeout=5)
        print(json.dumps({"status": health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}))
        return 0
    reflection = Reflection(channel, version)
    if verb == "list":
        print(json.dumps(reflection.services()))
        return 0
    if verb == "describe":
        service = reflection.service(rest[0])
        print(json.dumps([m.name for m in service.methods]))
        return 0
    if verb == "call":
        full, body = rest[0], rest[1]
        service_name, method_name = full.split("/")
        method = reflection.service(service_name).FindMethodByName(method_name)
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        request = json_format.Parse(body, request_cls())
        metadata = []
        if token_file:
            with open(token_file) as f:
                metadata.append(("authorization", "Bearer " + f.read().strip()))
        call = channel.unary_unary(
            f"/{service_name}/{method_name}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_cls.FromString,
        )
        try:
            reply = call(request, metadata=metadata, timeout=10)
        except grpc.RpcError as e:
            print(json.dumps({"code": e.code().name, "details": e.details()}))
            return 3
        print(json_format.MessageToJson(reply, preserving_proto_field_name=True))
        return 0
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
