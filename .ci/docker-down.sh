#!/usr/bin/env bash
# Stop the engine started by .ci/docker-up.sh (its pid file under $HERMES_DOCKER_DIR). Never fails.
DIR=${HERMES_DOCKER_DIR:-/tmp/hermes-docker}
pid=$(cat "$DIR/dockerd.pid" 2>/dev/null) || exit 0
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
  # Containers left by the tests go first, so the engine stops fast.
  ids=$(DOCKER_HOST="unix://$DIR/docker.sock" docker ps -aq --filter label=hermes-batch.run 2>/dev/null)
  [ -n "$ids" ] && DOCKER_HOST="unix://$DIR/docker.sock" docker rm -f $ids >/dev/null 2>&1
  kill -TERM "$pid"
  for _ in $(seq 1 75); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  echo "docker-down: engine $pid stopped" >&2
fi
rm -f "$DIR/dockerd.pid"
exit 0
