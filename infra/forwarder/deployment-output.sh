#!/usr/bin/env bash
# Prints one output of the main deployment, e.g. the storage account that holds the forwarder bundles:
#
#   infra/forwarder/deployment-output.sh [-e ENVIRONMENT | -d DEPLOYMENT] OUTPUT_NAME
#   az storage blob upload-batch --auth-mode login --overwrite -d forwarder-artifacts -s wheelhouse \
#     --account-name "$(infra/forwarder/deployment-output.sh ARTIFACTS_STORAGE_ACCOUNT_NAME)"
#
#   -e, --environment NAME  the environment (main.bicep's environmentName); default AZURE_ENV_NAME
#   -d, --deployment NAME   this subscription deployment (default: the environment's newest successful one)
# The output is matched without regard to case (ARM may return azurE_X for AZURE_X). An output, not a name
# pattern: the main account is stse<token> and the artifacts account stsea<token>, so a prefix match on
# "stsea" finds the main account whenever <token> starts with "a" (about 1 environment in 32).
# Exit codes: 0 printed; 2 bad usage; 3 no such deployment or output (one line on stderr says which).
set -euo pipefail

die() { echo "deployment-output: $2" >&2; exit "$1"; }
env_name="${AZURE_ENV_NAME:-}" deployment="" output=""
while [ $# -gt 0 ]; do
  case "$1" in
    -e|--environment) [ $# -ge 2 ] || die 2 "$1 needs a value"; env_name="$2"; shift 2 ;;
    -d|--deployment) [ $# -ge 2 ] || die 2 "$1 needs a value"; deployment="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) die 2 "unknown option $1 (--help lists them)" ;;
    *) [ -z "$output" ] || die 2 "one output name only"; output="$1"; shift ;;
  esac
done
[ -n "$output" ] || die 2 "give the output's name, e.g. ARTIFACTS_STORAGE_ACCOUNT_NAME (--help)"
[[ "$output" =~ ^[A-Za-z0-9_]{1,64}$ ]] || die 2 "an output name is letters, digits and _, not '$output'"
[[ -z "$env_name" || "$env_name" =~ ^[A-Za-z0-9-]{1,64}$ ]] || die 2 "environment '$env_name': letters, digits and hyphens only"

if [ -z "$deployment" ]; then
  [ -n "$env_name" ] || die 2 "give -e ENVIRONMENT or -d DEPLOYMENT (or set AZURE_ENV_NAME)"
  deployment="$(az deployment sub list --query "sort_by([?properties.provisioningState=='Succeeded' && (tags.\"azd-env-name\"=='$env_name' || properties.parameters.environmentName.value=='$env_name')], &properties.timestamp)[-1].name" -o tsv)" \
    || die 3 "cannot list the subscription's deployments (az login? az account set?)"
  [ -n "$deployment" ] && [ "$deployment" != "None" ] || die 3 "no successful deployment of environment '$env_name' in this subscription"
fi
rows="$(az deployment sub show --name "$deployment" --query "[keys(properties.outputs), properties.outputs.*.value]" -o tsv)" \
  || die 3 "cannot read the outputs of subscription deployment '$deployment' (az deployment sub list -o table shows the names)"
sep=$'\x1f'  # not a tab: read collapses runs of whitespace separators, and an empty value would shift the rest
IFS="$sep" read -r -a names <<< "$(sed -n 1p <<< "$rows" | tr '\t' "$sep")"
IFS="$sep" read -r -a values <<< "$(sed -n 2p <<< "$rows" | tr '\t' "$sep")"
wanted="$(printf '%s' "$output" | tr '[:lower:]' '[:upper:]')"
for i in "${!names[@]}"; do
  if [ "$(printf '%s' "${names[$i]}" | tr '[:lower:]' '[:upper:]')" = "$wanted" ]; then
    printf '%s\n' "${values[$i]:-}"
    exit 0
  fi
done
die 3 "deployment '$deployment' has no output $output (an older deployment? provision again)"
