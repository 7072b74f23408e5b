#!/usr/bin/env bash
# Puts the forwarder on existing VMs and scale sets with az CLI, from the outputs of the main deployment:
#   infra/forwarder/install-on-vms.sh <main-deployment-name> <resource-group-of-the-VMs> <Linux|Windows> vm:NAME... vmss:NAME...
# For each target: attach the VMs' user-assigned identity, then deploy install-vm.bicep / install-vmss.bicep
# (CustomScript extension), and for a scale set bring the instances to the latest model.
# Upload the bundles first (docs/deploy.md: `make wheelhouse` and `az storage blob upload-batch`).
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,6p' "$0"; exit 2; }
deployment="$1"; vm_group="$2"; os_type="$3"; shift 3
here="$(cd "$(dirname "$0")" && pwd)"

out() { az deployment sub show --name "$deployment" --query "properties.outputs.$1.value" -o tsv; }
identity_id="$(out VM_IDENTITY_ID)"
common=(
  osType="$os_type"
  artifactsUrl="$(out FORWARDER_ARTIFACTS_URL)"
  eventHubNamespace="$(out EVENTHUB_NAMESPACE)"
  eventHubName="$(out EVENTHUB_NAME)"
  vmIdentityClientId="$(out VM_IDENTITY_CLIENT_ID)"
  queueServiceUri="$(out QUEUE_SERVICE_URI)"
)

for target in "$@"; do
  kind="${target%%:*}"; name="${target#*:}"
  case "$kind" in
    vm)
      az vm identity assign -g "$vm_group" -n "$name" --identities "$identity_id" -o none
      az deployment group create -g "$vm_group" -n "se-forwarder-$name" \
        -f "$here/install-vm.bicep" -p vmName="$name" "${common[@]}" -o none
      ;;
    vmss)
      az vmss identity assign -g "$vm_group" -n "$name" --identities "$identity_id" -o none
      az deployment group create -g "$vm_group" -n "se-forwarder-$name" \
        -f "$here/install-vmss.bicep" -p vmssName="$name" "${common[@]}" -o none
      az vmss update-instances -g "$vm_group" -n "$name" --instance-ids '*' -o none
      ;;
    *) echo "install-on-vms: target must be vm:NAME or vmss:NAME, got '$target'" >&2; exit 2 ;;
  esac
  echo "install-on-vms: $target done"
done
