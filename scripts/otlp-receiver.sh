#!/bin/sh
# The tests' OpenTelemetry collector (Tests/tracing/otlp_receiver.py): opentelemetry-proto and
# grpcio from PyPI into a venv under .build/, offline once installed.
set -eu
venv=.build/otlp-venv
if ! "$venv/bin/python" -c 'import grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check opentelemetry-proto grpcio
fi
exec "$venv/bin/python" Tests/tracing/otlp_receiver.py
