#!/usr/bin/env bash
# Build the local test images without a registry (DOCKER_HOST must point at a running engine).
#
#   hermes-test/busybox:1            busybox-static root filesystem, `docker import` (~0.3 s)
#   hermes-test/python:bookworm      Debian 12 minbase + python3 by debootstrap (~70 s cold),
#                                    cached with `docker save` under $HERMES_IMAGE_CACHE
#   hermes-test/hermes-batch:ci      the project image (Dockerfile) FROM hermes-test/python:bookworm,
#                                    built from this checkout every time (~1 min: apt and pip over
#                                    --network host; the proxy's CA certificates of this machine,
#                                    if any, are passed as EXTRA_CA_CERTS)
#
# Each image has /etc/hermes-image holding its own name, so a test can tell which image ran.
# An image already present is kept (the project image is rebuilt: Docker's layer cache makes an
# unchanged one take seconds). Usage: bash .ci/images/build.sh [busybox] [python] [project]
set -euo pipefail

CACHE=${HERMES_IMAGE_CACHE:-/var/cache/hermes-batch/images}
BUSYBOX_IMAGE=hermes-test/busybox:1
PYTHON_IMAGE=hermes-test/python:bookworm
PROJECT_IMAGE=hermes-test/hermes-batch:ci
log() { echo "images: $*" >&2; }
have() { docker image inspect "$1" >/dev/null 2>&1; }

build_busybox() {
  have "$BUSYBOX_IMAGE" && return 0
  local root
  root=$(mktemp -d)
  trap 'rm -rf "$root"' RETURN
  mkdir -p "$root"/{bin,etc,tmp,root,proc,sys,dev}
  chmod 1777 "$root/tmp"
  cp /bin/busybox "$root/bin/busybox"
  chroot "$root" /bin/busybox --install -s /bin
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  echo "$BUSYBOX_IMAGE" >"$root/etc/hermes-image"
  tar -C "$root" -c . | docker import --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin' \
    --change 'ENV HOME=/root' - "$BUSYBOX_IMAGE" >/dev/null
  log "built $BUSYBOX_IMAGE"
}

build_python() {
  have "$PYTHON_IMAGE" && return 0
  local tarball="$CACHE/python-bookworm.tar"
  if [ -s "$tarball" ] && docker load -q -i "$tarball" >/dev/null 2>&1 && have "$PYTHON_IMAGE"; then
    log "loaded $PYTHON_IMAGE from $tarball"
    return 0
  fi
  local mirror root
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
  root=$(mktemp -d)
  trap 'rm -rf "$root"' RETURN
  log "debootstrap bookworm from $mirror (about a minute)"
  debootstrap --variant=minbase --include=python3 bookworm "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root.log"
  echo "$PYTHON_IMAGE" >"$root/etc/hermes-image"
  tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV HOME=/root' - "$PYTHON_IMAGE" >/dev/null
  mkdir -p "$CACHE"
  docker save -o "$tarball.tmp" "$PYTHON_IMAGE" && mv "$tarball.tmp" "$tarball"
  log "built $PYTHON_IMAGE (cached in $tarball)"
}

build_project() {
  local started=$SECONDS certs=""
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    certs=$(cat /usr/local/share/ca-certificates/*.crt)
  fi
  local build=(docker build -q --network host --build-arg BASE="$PYTHON_IMAGE" --build-arg EXTRA_CA_CERTS="$certs"
    -t "$PROJECT_IMAGE" "$(dirname "$0")/../..")
  # Engine 20.10's legacy builder has failed a COPY once in a while here ("Error processing tar file ...
  # after fallback to chroot: no such file or directory") and passed when run again: one more try.
  "${build[@]}" >/dev/null || { log "the project image build failed; trying once more"; "${build[@]}" >/dev/null; }
  log "built $PROJECT_IMAGE in $((SECONDS - started)) s ($(docker image inspect -f '{{.Size}}' "$PROJECT_IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
}

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(busybox python project)
for t in "${targets[@]}"; do "build_$t"; done
