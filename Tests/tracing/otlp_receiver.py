"""A small OpenTelemetry collector for the tests: OTLP/HTTP (protobuf) and OTLP/gRPC trace
receivers, decoded with the official opentelemetry-proto messages, and the spans it received
served back as JSON.

    otlp_receiver.py            prints "http PORT" and "grpc PORT" once both listen (loopback);
                                runs until SIGTERM or its parent process ends
    GET  /spans                 every span received, in arrival order
    POST /fail?status=N         answer the next exports with HTTP N / gRPC UNAVAILABLE (0: stop)

Each span: trace_id, span_id, parent_span_id (hex, "" for none), trace_state, name, kind
(SPAN_KIND_*), start/end (Unix ns), attributes {key: value}, events [name], status (STATUS_CODE_*),
status_message, resource {key: value}, scope, via ("http" | "grpc"), headers (the export's), peer (gRPC:
the exporter's address and port, which names its connection).
"""
import json
import os
import time
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

lock = threading.Lock()
spans = []
failing = {"status": 0}


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def record(request, via, headers, peer=None):
    with lock:
        for resource_spans in request.resource_spans:
            resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append({
                        "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(), "trace_state": span.trace_state,
                        "name": span.name, "kind": trace_pb2.Span.SpanKind.Name(span.kind),
                        "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                        "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                        "events": [event.name for event in span.events],
                        "status": trace_pb2.Status.StatusCode.Name(span.status.code), "status_message": span.status.message,
                        "resource": resource, "scope": scope_spans.scope.name, "via": via, "headers": headers, "peer": peer,
                    })


class HTTPReceiver(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body, content_type):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/spans":
            return self.answer(404, b"", "text/plain")
        with lock:
            body = json.dumps(spans).encode()
        self.answer(200, body, "application/json")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        url = urlparse(self.path)
        if url.path == "/fail":
            failing["status"] = int(parse_qs(url.query).get("status", ["0"])[0])
            return self.answer(204, b"", "text/plain")
        if url.path != "/v1/traces":
            return self.answer(404, b"", "text/plain")
        if failing["status"]:
            return self.answer(failing["status"], b"", "text/plain")
        if self.headers.get("content-type") != "application/x-protobuf":
            return self.answer(415, b"", "text/plain")
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        record(request, "http", {k.lower(): v for k, v in self.headers.items()})
        self.answer(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")


class GRPCReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        if failing["status"]:
            context.abort(grpc.StatusCode.UNAVAILABLE, "told to fail")
        record(request, "grpc", {k: v for k, v in context.invocation_metadata()}, context.peer())
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    http = ThreadingHTTPServer(("127.0.0.1", 0), HTTPReceiver)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(GRPCReceiver(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"http {http.server_address[1]}", flush=True)
    print(f"grpc {grpc_port}", flush=True)
    # Ends on SIGTERM, or when the test process that started it is gone.
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(1)
    server.stop(0)
    http.shutdown()


if __name__ == "__main__":
    main()
