#!/usr/bin/env bash
# with-server.sh CMD...: serve agentruntime on a free loopback port (embedded defaults),
# wait until it is healthy, run CMD with AGENTRUNTIME_ADDR set, then stop the server.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export AGENTRUNTIME_ADDR=127.0.0.1:$PORT
LOG=$(mktemp -t agentruntime-server.XXXXXX)
STORE_DIR=$(mktemp -d -t agentruntime-store.XXXXXX)
AGENTRUNTIME_METRICS_LISTEN=${AGENTRUNTIME_METRICS_LISTEN:-off} AGENTRUNTIME_STORE=${AGENTRUNTIME_STORE:-sqlite:///$STORE_DIR/agentruntime.db} .venv/bin/agentruntime serve --listen "$AGENTRUNTIME_ADDR" >"$LOG" 2>&1 &
SERVER_PID=$!
trap 'kill $SERVER_PID 2>/dev/null || true; wait $SERVER_PID 2>/dev/null || true; rm -rf "$LOG" "$STORE_DIR"' EXIT
"$PY" - "$AGENTRUNTIME_ADDR" <<'PYEOF' || { cat "$LOG" >&2; exit 1; }
import sys, time, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
channel = grpc.insecure_channel(sys.argv[1])
for _ in range(100):
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            sys.exit(0)
    except grpc.RpcError:
        pass
    time.sleep(0.1)
sys.exit("the server did not become healthy within 10s")
PYEOF
status=0
"$@" || status=$?
if [[ $status -ne 0 ]]; then echo "---- server log ----" >&2; tail -50 "$LOG" >&2; fi
exit $status
