#!/usr/bin/env bash
# Start a private Docker engine for the tests and build the local test images.
#
#   eval "$(bash .ci/docker-up.sh)"     # prints `export DOCKER_HOST=...` on stdout, logs on stderr
#   bash .ci/docker-down.sh             # stops the engine this script started
#
# With HERMES_IMAGES_ASYNC=1 the test images are built in the background (.ci/run overlaps their
# minutes of downloads with pip and the first test phase): it also prints `export HERMES_IMAGES_STATUS=FILE`;
# FILE says `building`, then `ok` or `failed` (the build's log is FILE.log). The tests that need an
# image wait for it (tests/hermes_core/environments/test_docker_environment.py, require_engine).
#
# The engine leaves the host network alone (no bridge, no iptables/NAT, no ip_forward);
# its socket, data and state live under $HERMES_DOCKER_DIR (default /tmp/hermes-docker).
# An engine already answering on that socket is reused. Debian packages (docker.io,
# busybox-static, debootstrap, bubblewrap, slirp4netns, iproute2) are installed with apt only when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${HERMES_DOCKER_DIR:-/tmp/hermes-docker}
SOCK="unix://$DIR/docker.sock"
log() { echo "docker-up: $*" >&2; }

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)   # the sandboxes' outbound-only network
command -v ip >/dev/null 2>&1 || missing+=(iproute2)   # the network tests' stand-in internet
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

mkdir -p "$DIR"
if DOCKER_HOST=$SOCK docker info >/dev/null 2>&1; then
  log "reusing the engine on $SOCK"
else
  rm -f "$DIR/docker.sock" "$DIR/dockerd.pid"
  # setsid + nohup: the engine outlives this script; docker-down.sh stops it by its pid file.
  # Its own mount namespace (private): the containers' overlay mounts stay out of the host's table.
  # In the host's, every bubblewrap sandbox started meanwhile copied them, and Engine 20.10 then ran
  # some new containers without their root filesystem ("exec sleep failed: No such file or
  # directory", exit 127): 11 of 160 beside the bubblewrap tests, 0 of 280 in its own namespace.
  setsid nohup unshare --mount --propagation private dockerd --host="$SOCK" --data-root="$DIR/data" --exec-root="$DIR/exec" \
    --pidfile="$DIR/dockerd.pid" --iptables=false --ip6tables=false --ip-forward=false \
    --ip-masq=false --bridge=none </dev/null >"$DIR/dockerd.log" 2>&1 &
  for _ in $(seq 1 150); do
    DOCKER_HOST=$SOCK docker info >/dev/null 2>&1 && break
    sleep 0.2
  done
  if ! DOCKER_HOST=$SOCK docker info >/dev/null 2>&1; then
    log "the engine did not answer within 30 s; last lines of $DIR/dockerd.log:"
    tail -20 "$DIR/dockerd.log" >&2
    exit 1
  fi
  log "engine started on $SOCK (pid $(cat "$DIR/dockerd.pid"))"
fi

if [ "${HERMES_IMAGES_ASYNC:-0}" = 1 ]; then
  status="$DIR/images.status"
  echo building >"$status"
  # setsid + every stream redirected: the build outlives this script and holds no pipe of the caller
  DOCKER_HOST=$SOCK setsid nohup bash -c \
    'bash .ci/images/build.sh && echo ok >"$1" || echo failed >"$1"' images "$status" \
    </dev/null >"$status.log" 2>&1 &
  log "building the test images in the background (status: $status, log: $status.log)"
  echo "export HERMES_IMAGES_STATUS=$status"
else
  DOCKER_HOST=$SOCK bash .ci/images/build.sh >&2
fi
echo "export DOCKER_HOST=$SOCK"
