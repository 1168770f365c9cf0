#!/usr/bin/env bash
# check-version.sh: every manifest carries the one release version in VERSION (the Go module's
# version is its git tag, clients/go/vVERSION, so it has none to check), so do the deploy files and
# every artifact the docs name with a version (an image tag, a wheel, a jar, a tarball, the Go
# tag), and CHANGELOG.md describes it; a release the docs name (release 0.1.0, written by 0.2.0)
# is one CHANGELOG.md has. The server's User-Agent is its installed version: tests/adapters/
# test_http_client.py holds it to VERSION.
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
check deploy/k8s/kustomization.yaml "$(sed -n 's/^ *newTag: "\(.*\)"$/\1/p' deploy/k8s/kustomization.yaml)"

# An artifact named with a version in a page or a deploy file: agentruntime:V, agentruntime_client-V,
# agentruntime-client-V, @agentruntime/client` V, clients/go@vV, clients/go/vV, clients/go vV,
# <version>V</version>, V (the repository's `VERSION`).
artifact='(agentruntime:|agentruntime[_-]client-|@agentruntime/client` |clients/go[@/ ]v|<version>)[0-9]+\.[0-9]+\.[0-9]+|[0-9]+\.[0-9]+\.[0-9]+ \(the repository.s .VERSION'
pages=(README.md docs/*.md clients/*/README.md deploy/compose.yaml)
while IFS=: read -r file found; do
    check "$file (${found})" "$(grep -oE '[0-9]+\.[0-9]+\.[0-9]+' <<<"$found")"
done < <(grep -oE "$artifact" "${pages[@]}")

# CHANGELOG.md: its newest release is VERSION, and every release a page names is one of its.
newest=$(sed -n 's/^## \[\([0-9.]*\)\].*/\1/p' CHANGELOG.md | head -1)
check "CHANGELOG.md (its newest release)" "$newest"
while IFS=: read -r file found; do
    version=$(grep -oE '[0-9]+\.[0-9]+\.[0-9]+' <<<"$found")
    if ! grep -q "^## \[$version\]" CHANGELOG.md; then
        echo "check-version: $file names $found, which CHANGELOG.md has no release for" >&2; status=1
    fi
done < <(grep -oE '(release|by|before|since|until|of) [0-9]+\.[0-9]+\.[0-9]+' "${pages[@]}")
exit $status
