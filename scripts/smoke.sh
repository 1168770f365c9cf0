#!/usr/bin/env bash
# Smoke test: serve agentruntime on a free loopback port and walk the grpcurl walkthrough of
# docs/walkthrough.md against it (list, describe, CreateRuntime, Spawn, Wake, Wait, List,
# Inspect, GetTranscript), then the one of docs/suspension.md (Wait PENDING, Resume, Resume
# again), checking each answer. Run it with `make smoke`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=.venv/bin/python
SERVER=.venv/bin/agentruntime
GRPCURL=${GRPCURL:-.tools/bin/grpcurl}
SERVICE=agentruntime.v1.AgentRuntime

for tool in "$PY" "$SERVER" "$GRPCURL"; do
  [[ -x $tool ]] || { echo "smoke: $tool is missing; run 'make install grpcurl' first" >&2; exit 2; }
done

PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ADDR=127.0.0.1:$PORT
LOG=$(mktemp -t agentruntime-smoke.XXXXXX)
STORE_DIR=$(mktemp -d -t agentruntime-smoke-store.XXXXXX)
SERVER_PID=

stop_server() {
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$LOG" "$STORE_DIR"
}
trap stop_server EXIT

passed=0
pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() {
  echo "FAIL $1" >&2
  [[ $# -ge 2 ]] && printf '%s\n' "$2" | sed 's/^/     /' >&2
  echo "---- server log ----" >&2
  cat "$LOG" >&2
  echo "smoke: $passed passed, 1 failed"
  exit 1
}

# grpcurl prints proto3 JSON; normalise keys to snake_case so checks read like the proto.
CHECK='
import json, re, sys
def snake(o):
    if isinstance(o, dict):
        return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): snake(v) for k, v in o.items()}
    if isinstance(o, list):
        return [snake(v) for v in o]
    return o
r = snake(json.load(sys.stdin))
sys.exit(0 if eval(sys.argv[1], {"r": r}) else 1)
'
# check NAME JSON EXPR: EXPR is Python over `r`, the parsed answer (int64 fields are strings).
check() {
  if "$PY" -c "$CHECK" "$3" <<<"$2"; then pass "$1"; else fail "$1: expected $3" "$2"; fi
}
# call METHOD JSON: one unary call of the AgentRuntime service (errors included in the output).
call() {
  "$GRPCURL" -plaintext -max-time 60 -d "$2" "$ADDR" "$SERVICE/$1" 2>&1
}

# --- start the server and wait for health ------------------------------------
AGENTRUNTIME_METRICS_LISTEN=off "$SERVER" serve --listen "$ADDR" --store "sqlite:///$STORE_DIR/smoke.db" >"$LOG" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  if health=$("$GRPCURL" -plaintext -max-time 2 "$ADDR" grpc.health.v1.Health/Check 2>/dev/null); then break; fi
  kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited during startup"
  sleep 0.2
done
grep -q '"SERVING"' <<<"${health:-}" || fail "health check on $ADDR" "${health:-no answer within 20s}"
pass "health: SERVING on $ADDR"

# --- reflection ---------------------------------------------------------------
services=$("$GRPCURL" -plaintext "$ADDR" list) || fail "list"
for name in "$SERVICE" grpc.health.v1.Health grpc.reflection.v1alpha.ServerReflection; do
  grep -qx "$name" <<<"$services" || fail "list shows $name" "$services"
done
pass "list: AgentRuntime, Health and reflection are served"

described=$("$GRPCURL" -plaintext "$ADDR" describe "$SERVICE") || fail "describe"
for rpc in CreateRuntime Spawn Post Wake Wait Resume Interrupt Close Inspect List GetTranscript Watch ListRuntimes DeleteRuntime; do
  grep -q "rpc $rpc (" <<<"$described" || fail "describe shows rpc $rpc" "$described"
done
pass "describe: all 14 RPCs"

# --- the walkthrough ----------------------------------------------------------
PROMPT='How does the Python GIL affect CPU-bound threads?'
COORD=root/coordinator.1

out=$("$GRPCURL" -plaintext -max-time 60 -d @ "$ADDR" "$SERVICE/CreateRuntime" <examples/agents.json 2>&1) ||
  fail "CreateRuntime from examples/agents.json returned an error" "$out"
check "CreateRuntime: runtime demo" "$out" 'r["runtime_id"] == "demo"'

out=$(call Spawn '{"runtime_id": "demo", "parent_id": "root", "agent": "coordinator"}') || fail "Spawn returned an error" "$out"
check "Spawn: coordinator under root is $COORD" "$out" "r['handle_id'] == '$COORD'"

out=$(call Wake "{\"runtime_id\": \"demo\", \"handle_id\": \"$COORD\", \"prompt\": \"$PROMPT\"}") || fail "Wake returned an error" "$out"
check "Wake: queued" "$out" 'r.get("queued") is True'

out=$(call Wait "{\"runtime_id\": \"demo\", \"handle_id\": \"$COORD\", \"timeout\": \"30s\"}") || fail "Wait returned an error" "$out"
check "Wait: STATUS_DONE, no limit" "$out" 'r["result"]["status"] == "STATUS_DONE" and "limit" not in r["result"]'
check "Wait: total_tokens > own_tokens (the team's spend is in the bill)" "$out" \
  'int(r["result"]["total_tokens"]) > int(r["result"]["own_tokens"]) > 0'
check "Wait: 2 turns, 2 task calls" "$out" 'r["result"]["turns"] == "2" and r["result"]["tool_calls"] == "2"'
wait_result=$out

out=$(call List '{"runtime_id": "demo"}') || fail "List returned an error" "$out"
check "List: coordinator, explore, summarize in spawn order" "$out" \
  '[h["agent"] for h in r["handles"]] == ["coordinator", "explore", "summarize"]'
check "List: parent total = own + children totals" "$out" \
  'int(r["handles"][0]["total_tokens"]) == int(r["handles"][0]["own_tokens"]) + sum(int(h["total_tokens"]) for h in r["handles"][1:])'
check "List: every handle IDLE after STATUS_DONE" "$out" \
  'all(h["state"] == "HANDLE_STATE_IDLE" and h["last_status"] == "STATUS_DONE" for h in r["handles"])'
explore=$("$PY" -c 'import json, sys; print(json.load(sys.stdin)["handles"][1]["handle_id"])' <<<"$out") ||
  fail "List: no second handle" "$out"

out=$(call Inspect "{\"runtime_id\": \"demo\", \"handle_id\": \"$explore\"}") || fail "Inspect returned an error" "$out"
check "Inspect: $explore is a child of $COORD with a carved budget" "$out" \
  "r['handle']['parent_id'] == '$COORD' and int(r['handle']['budget']['max_turns']) < 10"

out=$(call GetTranscript "{\"runtime_id\": \"demo\", \"handle_id\": \"$COORD\"}") || fail "GetTranscript returned an error" "$out"
final_text=$("$PY" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["result"]["text"]))' <<<"$wait_result") ||
  fail "Wait: no result text" "$wait_result"
check "GetTranscript: user, 2 task calls, 2 tool results, the final answer" "$out" \
  "[m['role'] for m in r['messages']] == ['user', 'assistant', 'tool', 'tool', 'assistant'] and r['messages'][-1]['content'] == $final_text"

# --- suspension and resume (docs/suspension.md) -------------------------------
out=$("$GRPCURL" -plaintext -max-time 60 -d @ "$ADDR" "$SERVICE/CreateRuntime" <examples/release.json 2>&1) ||
  fail "CreateRuntime from examples/release.json returned an error" "$out"
out=$(call Spawn '{"runtime_id": "release", "parent_id": "root", "agent": "lead"}') || fail "Spawn lead" "$out"
out=$(call Wake '{"runtime_id": "release", "handle_id": "root/lead.1", "prompt": "Ship v2."}') || fail "Wake lead" "$out"
out=$(call Wait '{"runtime_id": "release", "handle_id": "root/lead.1", "timeout": "30s"}') || fail "Wait lead" "$out"
check "Wait: PENDING on the release agent's deploy call" "$out" \
  'r["result"]["status"] == "STATUS_PENDING" and r["result"]["pending"]["path"] == ["root", "lead.1", "release.1"] and r["result"]["pending"]["calls"][0]["name"] == "deploy" and r["result"]["total_tokens"] == "110"'
ANSWER='{"runtime_id": "release", "answer": {"id": "root/lead.1/release.1/call_1_1:tool_call", "ok": true, "outputs": [{"call_id": "call_1_1", "output": "deployed v2 at 12:00"}]}}'
out=$(call Resume "$ANSWER") || fail "Resume returned an error" "$out"
check "Resume: DONE, no turn bought twice (2 turns, 220 tokens)" "$out" \
  'r["result"]["status"] == "STATUS_DONE" and r["result"]["turns"] == "2" and r["result"]["total_tokens"] == "220"'
again=$(call Resume "$ANSWER") || fail "the same Resume again returned an error" "$again"
[[ $again == "$out" ]] && pass "Resume again: the same result" || fail "Resume again: the same result" "$again"

echo "smoke: $passed passed, 0 failed"
