#!/usr/bin/env bash
# consumer/test.sh TARBALL TYPESCRIPT_VERSION TYPES_NODE_VERSION: a fresh npm project in a temporary
# directory (removed afterwards) that depends on the released tarball only, compiles this
# directory's programs strictly (tsconfig.json: strict, no skipLibCheck, no DOM lib) and runs them
# against the server at AGENTRUNTIME_ADDR: main.ts as ES modules, require.cts as CommonJS.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TARBALL=$1
TS_VERSION=$2
TYPES_NODE_VERSION=$3
: "${AGENTRUNTIME_ADDR:?AGENTRUNTIME_ADDR must name a running server (scripts/with-server.sh sets it)}"
[[ -f $TARBALL ]] || { echo "consumer-test: no $TARBALL (make release first)" >&2; exit 1; }
WORK=$(mktemp -d -t agentruntime-ts-consumer.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cp "$HERE/main.ts" "$HERE/require.cts" "$HERE/tsconfig.json" "$WORK/"
cd "$WORK"
printf '{\n  "name": "agentruntime-consumer",\n  "private": true,\n  "type": "module"\n}\n' >package.json
npm install --no-audit --no-fund --loglevel=error --save-exact \
    "$TARBALL" "typescript@$TS_VERSION" "@types/node@$TYPES_NODE_VERSION" >/dev/null
echo "consumer-test: $(node -p 'require("@agentruntime/client/package.json").version') from $(basename "$TARBALL") in $WORK"
npx --no-install tsc -p tsconfig.json
node main.js
node require.cjs
