#!/usr/bin/env bash
# restart-server.sh WORK PORT: the conformance runners' restart hook (AGENTRUNTIME_RESTART_HOOK,
# set by with-server.sh and with-secure-server.sh). Kills the server as a crash would (SIGKILL: no
# drain), starts it again from WORK/serve.sh on the same port and store, and returns once the port
# accepts connections. The clients must make the gap invisible to their callers.
set -euo pipefail
WORK=$1
PORT=$2
old=$(cat "$WORK/server.pid")
kill -KILL "$old" 2>/dev/null || true
for _ in $(seq 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.05; done
"$WORK/serve.sh" >>"$WORK/server.log" 2>&1 </dev/null &
echo $! >"$WORK/server.pid"
for _ in $(seq 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then exit 0; fi
    sleep 0.05
done
echo "restart-server.sh: the server did not listen on port $PORT again within 10s" >&2
exit 1
