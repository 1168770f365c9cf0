#!/usr/bin/env bash
# with-server.sh CMD...: serve agentruntime on a free loopback port (embedded defaults; the prices of
# tests/vectors/prices/prices.json unless AGENTRUNTIME_PRICES names another file),
# wait until it is healthy, run CMD with AGENTRUNTIME_ADDR and AGENTRUNTIME_RESTART_HOOK set, then
# stop the server.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export AGENTRUNTIME_ADDR=127.0.0.1:$PORT
WORK=$(mktemp -d -t agentruntime-server.XXXXXX)
LOG=$WORK/server.log
# The server's command line in a script of its own, so that the restart hook starts the same one.
{
    echo '#!/usr/bin/env bash'
    printf 'export AGENTRUNTIME_METRICS_LISTEN=%q\n' "${AGENTRUNTIME_METRICS_LISTEN:-off}"
    printf 'export AGENTRUNTIME_STORE=%q\n' "${AGENTRUNTIME_STORE:-sqlite:///$WORK/agentruntime.db}"
    printf 'export AGENTRUNTIME_PRICES=%q\n' "${AGENTRUNTIME_PRICES:-$PWD/tests/vectors/prices/prices.json}"
    printf 'exec %q serve --listen %q\n' "$PWD/.venv/bin/agentruntime" "$AGENTRUNTIME_ADDR"
} >"$WORK/serve.sh"
chmod +x "$WORK/serve.sh"
"$WORK/serve.sh" >"$LOG" 2>&1 &
echo $! >"$WORK/server.pid"
disown  # the restart hook may kill it: no job notice
trap 'scripts/stop-server.sh "$WORK"' EXIT
# A vector that restarts the server mid-call runs this (tests/vectors/README.md, Restarts).
export AGENTRUNTIME_RESTART_HOOK="$PWD/scripts/restart-server.sh $WORK $PORT"
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
