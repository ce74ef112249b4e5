#!/usr/bin/env bash
# Convenience: create the work pools (if missing) and deploy every deployment of prefect.yaml.
# It does nothing that the plain Prefect commands do not:
#   prefect work-pool create hermes-batch --type process
#   prefect work-pool create hermes-batch-docker --type docker    # generate-docker (the project image)
#   prefect --no-prompt deploy --all
#
# Usage: PREFECT_API_URL=http://127.0.0.1:4200/api deployments/deploy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export DO_NOT_TRACK="${DO_NOT_TRACK:-1}"
: "${PREFECT_API_URL:?set PREFECT_API_URL to your Prefect server, e.g. http://127.0.0.1:4200/api}"

for pool_type in hermes-batch:process hermes-batch-docker:docker; do
  pool=${pool_type%%:*}
  if ! prefect work-pool inspect "$pool" >/dev/null 2>&1; then
    prefect work-pool create "$pool" --type "${pool_type##*:}"
  fi
done
prefect --no-prompt deploy --all
