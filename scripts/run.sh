#!/usr/bin/env bash
# make run: the server, and beside it the web console (docs/console.md) pointed at it. Ctrl-C
# (or SIGTERM) stops both; either one ending stops the other.
set -euo pipefail
agentruntime=${1:-.venv/bin/agentruntime}
listen=${AGENTRUNTIME_LISTEN:-127.0.0.1:50051}
port=${listen##*:}
host=${listen%:*}
case "$host" in 0.0.0.0 | "[::]" | "") host=127.0.0.1 ;; esac

"$agentruntime" serve &
server=$!
"$agentruntime" console --target "${AGENTRUNTIME_ADDR:-$host:$port}" &
console=$!
stopping=0
stop() { kill -TERM "$server" "$console" 2>/dev/null || true; }
trap 'stopping=1; stop' INT TERM
status=0
wait -n "$server" "$console" || status=$?
stop
wait || true
if [ "$stopping" = 1 ]; then exit 0; fi  # asked to stop: both did
exit "$status"
