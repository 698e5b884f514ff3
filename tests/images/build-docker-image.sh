#!/usr/bin/env bash
# Builds the image the live docker tests run (polar-test-python:bookworm by default) from
# Debian's packages, with nothing pulled from an image registry: a minbase bookworm root
# filesystem (sh, coreutils, grep) plus Python, pytest and git (SWE-style task images are built
# on it), imported with `docker import`. Idempotent: does nothing when the image exists and has
# them; rebuilds one made before they were added. Needs root, debootstrap and a running Docker
# engine. Usage: build-docker-image.sh [image]   (env: POLAR_DEBIAN_MIRROR)
set -euo pipefail

image="${1:-${POLAR_TEST_DOCKER_IMAGE:-polar-test-python:bookworm}}"
mirror="${POLAR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if docker image inspect "$image" >/dev/null 2>&1; then
    if docker run --rm --network none "$image" sh -c 'command -v git && python3 -c "import pytest"' \
        >/dev/null 2>&1; then
        echo "image $image exists"
        exit 0
    fi
    echo "image $image lacks git or pytest: rebuilding it"
fi
command -v debootstrap >/dev/null || { echo "debootstrap is not installed" >&2; exit 1; }

rootfs="$(mktemp -d /var/tmp/polar-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT
# python3 (not python3-minimal): the tests' clients inside use urllib.request and http.client;
# git and pytest: the SWE tests check out, diff and test repositories inside.
debootstrap --variant=minbase --include=python3,python3-pytest,git bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
    tail -20 "$rootfs.log" >&2
    rm -f "$rootfs.log"
    exit 1
}
rm -f "$rootfs.log"
# Nothing a test needs: package caches, docs, manuals, locales.
rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/info/*
tar --numeric-owner -C "$rootfs" -c . |
    docker import --change 'CMD ["/bin/sh"]' - "$image" >/dev/null
echo "built $image ($(docker image inspect -f '{{.Size}}' "$image") bytes)"
