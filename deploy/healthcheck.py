#!/opt/agentruntime/bin/python
"""The image's HEALTHCHECK (installed as /opt/agentruntime/bin/agentruntime-health): asks the
gRPC health service of the server in this container, on 127.0.0.1 at AGENTRUNTIME_LISTEN's
port, and exits 0 when it answers SERVING, 1 otherwise (NOT_SERVING while its store is away,
or no answer within 2 s).

With TLS (AGENTRUNTIME_TLS_CERT set) it verifies the server with AGENTRUNTIME_REPLICA_CA (else
the system's roots), expecting the name AGENTRUNTIME_HEALTH_TLS_NAME (else the host of
AGENTRUNTIME_ADVERTISE), and presents the server's own certificate when the server requires
client certificates (AGENTRUNTIME_TLS_CLIENT_CA). The health service needs no token."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def channel() -> grpc.Channel:
    port = os.environ.get("AGENTRUNTIME_LISTEN", "0.0.0.0:50051").rpartition(":")[2]
    target = f"127.0.0.1:{port}"
    cert = os.environ.get("AGENTRUNTIME_TLS_CERT")
    if not cert:
        return grpc.insecure_channel(target)
    ca = os.environ.get("AGENTRUNTIME_REPLICA_CA")
    mutual = bool(os.environ.get("AGENTRUNTIME_TLS_CLIENT_CA"))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes() if ca else None,
        private_key=Path(os.environ["AGENTRUNTIME_TLS_KEY"]).read_bytes() if mutual else None,
        certificate_chain=Path(cert).read_bytes() if mutual else None,
    )
    name = os.environ.get("AGENTRUNTIME_HEALTH_TLS_NAME") or os.environ.get("AGENTRUNTIME_ADVERTISE", "").rpartition(":")[0]
    options = [("grpc.ssl_target_name_override", name.strip("[]"))] if name else []
    return grpc.secure_channel(target, credentials, options=options)


def main() -> int:
    try:
        with channel() as open_channel:
            reply = health_pb2_grpc.HealthStub(open_channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    except (grpc.RpcError, OSError, KeyError) as error:
        print(f"unhealthy: {error}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
