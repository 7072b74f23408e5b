#!/usr/bin/env bash
# Remediates every VM, scale set and availability set that existed before the se-coverage assignment
# (infra/coverage/main.bicep): one remediation task per policy of the initiative. New resources need none:
# Azure Policy deploys to them after they are created (docs/deploy.md, "Cover a whole subscription").
#   infra/coverage/remediate.sh                                  # the current subscription (az account show)
#   infra/coverage/remediate.sh --management-group <mg-id>       # an assignment made by main-mg.bicep
#   --assignment <name> (default se-coverage); --re-evaluate (subscription only: scan again before)
set -euo pipefail

die() { echo "remediate: $2" >&2; exit "$1"; }

assignment=se-coverage mg="" discovery=ExistingNonCompliant
while [ $# -gt 0 ]; do
  case "$1" in
    --management-group) mg="${2:?--management-group needs an id}"; shift 2 ;;
    --assignment) assignment="${2:?--assignment needs a name}"; shift 2 ;;
    --re-evaluate) discovery=ReEvaluateCompliance; shift ;;
    *) die 2 "unknown argument '$1' (--management-group ID, --assignment NAME, --re-evaluate)" ;;
  esac
done

if [ -n "$mg" ]; then
  [ "$discovery" = ExistingNonCompliant ] || die 2 "--re-evaluate is for a subscription: Azure re-evaluates no management group on demand"
  scope="/providers/Microsoft.Management/managementGroups/$mg"
  where=(--management-group "$mg")
else
  sub="$(az account show --query id -o tsv)" || die 3 "az account show failed (az login? az account set -s <subscription>?)"
  scope="/subscriptions/$sub"
  where=()
fi
id="$scope/providers/Microsoft.Authorization/policyAssignments/$assignment"
set_id="$(az policy assignment show --name "$assignment" --scope "$scope" --query policyDefinitionId -o tsv)" \
  || die 4 "no policy assignment '$assignment' at $scope: deploy infra/coverage/main.bicep first (docs/deploy.md)"
refs="$(az policy set-definition show --name "${set_id##*/}" ${mg:+--management-group "$mg"} \
  --query "policyDefinitions[].policyDefinitionReferenceId" -o tsv)" || die 4 "cannot read the initiative $set_id"

stamp="$(date -u +%Y%m%d%H%M%S)"
for ref in $refs; do
  az policy remediation create "${where[@]}" --name "se-$ref-$stamp" --policy-assignment "$id" \
    --definition-reference-id "$ref" --resource-discovery-mode "$discovery" -o none
  echo "remediate: $ref: task se-$ref-$stamp started (az policy remediation show -n se-$ref-$stamp${mg:+ --management-group $mg})"
done
if [ -n "$mg" ]; then check="--management-group $mg"; else check="--subscription $sub"; fi
echo "remediate: then: se-fleet coverage $check lists the VMs still blind (docs/deploy.md)"
