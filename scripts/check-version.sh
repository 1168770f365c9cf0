#!/usr/bin/env bash
# check-version.sh: every manifest carries the one release version in VERSION (the Go module's
# version is its git tag, clients/go/vVERSION, so it has none to check).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
want=$(cat VERSION)
status=0
check() {  # check FILE FOUND
    if [[ $2 != "$want" ]]; then echo "check-version: $1 says ${2:-nothing}, VERSION says $want" >&2; status=1; fi
}
toml_version() { sed -n 's/^version = "\(.*\)"$/\1/p' "$1" | head -1; }
check clients/python/pyproject.toml "$(toml_version clients/python/pyproject.toml)"
check server/pyproject.toml "$(toml_version server/pyproject.toml)"
check "server/pyproject.toml (its agentruntime-client)" "$(sed -n 's/^ *"agentruntime-client==\(.*\)",$/\1/p' server/pyproject.toml)"
check clients/typescript/package.json "$(sed -n 's/^  "version": "\(.*\)",$/\1/p' clients/typescript/package.json)"
check clients/typescript/package-lock.json "$(sed -n '0,/^  "version": "\(.*\)",$/s//\1/p' clients/typescript/package-lock.json | head -1)"
# The project's own version: the first <version> after the pom's own <artifactId>.
check clients/java/pom.xml "$(sed -n '/<artifactId>agentruntime-client<\/artifactId>/,/<version>/s/.*<version>\(.*\)<\/version>.*/\1/p' clients/java/pom.xml | head -1)"
# The Java runner's project, the reactor that builds both, and the consumer test's template.
after_artifact() {  # after_artifact FILE ARTIFACT: the first <version> after that <artifactId>
    sed -n "/<artifactId>$2<\/artifactId>/,/<version>/s/.*<version>\(.*\)<\/version>.*/\1/p" "$1" | head -1
}
check "clients/java/conformance/pom.xml (its agentruntime-client)" \
    "$(sed -n '/<dependency>/,/<\/dependency>/p' clients/java/conformance/pom.xml | after_artifact /dev/stdin agentruntime-client)"
check clients/java/reactor.xml "$(after_artifact clients/java/reactor.xml agentruntime-java-reactor)"
check clients/java/consumer/pom.xml "$(sed -n 's/.*<agentruntime.version>\(.*\)<\/agentruntime.version>.*/\1/p' clients/java/consumer/pom.xml)"
exit $status
