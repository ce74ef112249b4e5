#!/usr/bin/env bash
# Convenience: create the process work pool (if missing) and deploy every deployment of prefect.yaml.
# It does nothing that the plain Prefect commands do not:
#   prefect work-pool create hermes-batch --type process && prefect --no-prompt deploy --all
#
# Usage: PREFECT_API_URL=http://127.0.0.1:4200/api deployments/deploy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export DO_NOT_TRACK="${DO_NOT_TRACK:-1}"
: "${PREFECT_API_URL:?set PREFECT_API_URL to your Prefect server, e.g. http://127.0.0.1:4200/api}"

pool="${HERMES_WORK_POOL:-hermes-batch}"
if ! prefect work-pool inspect "$pool" >/dev/null 2>&1; then
  prefect work-pool create "$pool" --type process
fi
prefect --no-prompt deploy --all
