#!/usr/bin/env bash
# The local stand-in for python:3.11-slim-bookworm, for machines that reach no container
# registry: Debian bookworm (debootstrap --variant=minbase from deb.debian.org) with its
# python3 (3.11, so the host's cp311 wheels fit), python3-venv, ca-certificates, tzdata and
# netbase, imported as one layer. Kept between runs: nothing is done when the image exists
# (FORCE=1 makes it again).
#
#   deploy/local-base.sh [IMAGE]        default IMAGE: localhost/agentruntime-base:bookworm
#
# Needs root, debootstrap and podman (make container-tools installs them).
set -euo pipefail

IMAGE=${1:-localhost/agentruntime-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PODMAN=${PODMAN:-podman}

if [[ -z "${FORCE:-}" ]] && $PODMAN image exists "$IMAGE"; then
    echo "base image $IMAGE exists (FORCE=1 to make it again)"
    exit 0
fi

root=$(mktemp -d /var/tmp/agentruntime-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
started=$SECONDS
echo "debootstrap bookworm (minbase) into $root from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,tzdata,netbase \
    bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -n 40 "$root.log"; rm -f "$root.log"; exit 1; }
rm -f "$root.log"

# What the official slim images leave out too: apt's lists and caches, docs, man pages,
# locales but C.UTF-8.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log \
    "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
test -x "$root"/usr/bin/python3
"$root"/usr/bin/python3 --version >/dev/null 2>&1 || true

tar --numeric-owner -C "$root" -c . | $PODMAN import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    --message "debootstrap bookworm minbase + python3 (deploy/local-base.sh)" \
    - "$IMAGE" >/dev/null
echo "base image $IMAGE made in $((SECONDS - started)) s: $($PODMAN image inspect --format '{{.Size}}' "$IMAGE") bytes"
