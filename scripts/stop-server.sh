#!/usr/bin/env bash
# stop-server.sh WORK: stops the server whose pid is in WORK/server.pid (SIGTERM, then SIGKILL
# after 10 s) and deletes WORK. The pid file, not the first process, because the restart hook
# (restart-server.sh) may have started another one since.
WORK=$1
if [[ -f $WORK/server.pid ]]; then
    pid=$(cat "$WORK/server.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
fi
rm -rf "$WORK"
