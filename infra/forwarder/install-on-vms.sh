#!/usr/bin/env bash
# Installs the forwarder on existing VMs, scale sets and availability sets, with every input taken from the
# main deployment, and with --platform-feed / --agentless opts them into Azure's own scheduled-events feed:
#
#   infra/forwarder/install-on-vms.sh -g VM_RESOURCE_GROUP [options] TARGET...
#
#   TARGET   vm:NAME     one VM
#            vmss:NAME   a scale set: Uniform = its model, then every instance brought to it;
#                        Flexible = every member VM, one by one (as vm:NAME). Run it again after a
#                        scale-out: new instances get their approval queue access then
#            avset:NAME  an availability set: every member VM (as vm:NAME)
#            all         every VM of the group (standalone, Flexible or availability set member) and every
#                        Uniform scale set
#   -g, --resource-group RG  the resource group of the VMs / scale sets (required)
#   -e, --environment NAME   the environment (azd's, = main.bicep's environmentName); default
#                            AZURE_ENV_NAME, else azd's default environment
#   -d, --deployment NAME    take the outputs of this subscription deployment
#       --os Linux|Windows   skip the OS lookup (default: read from each VM / scale set)
#       --dry-run            resolve everything, print the commands that change something, run none
#       --platform-feed      also opt each target into the platform feed (PREVIEW): scheduledEventsPolicy
#                            (Event Grid and Resource Graph) on the resource that owns its events (the VM,
#                            or its availability set or scale set) and Scheduled Events Contributor there for
#                            central's identity, so central may approve through ARM (platform-opt-in.sh)
#       --agentless          the platform opt-in only, no forwarder: central approves these VMs through ARM
#                            (no hooks on them; docs/deploy.md, "The platform feed")
#
# Inputs (FORWARDER_ARTIFACTS_URL EVENTHUB_NAMESPACE EVENTHUB_NAME VM_IDENTITY_ID VM_IDENTITY_CLIENT_ID
# QUEUE_SERVICE_URI STORAGE_ACCOUNT_ID; with --platform-feed also FUNCTION_PRINCIPAL_ID; --agentless needs
# only FUNCTION_PRINCIPAL_ID): each from the first of these that has it:
#   1. the environment variable of that name;
#   2. the deployment named with --deployment;
#   3. `azd env get-values` (when azd is installed and the environment exists);
#   4. the newest successful subscription deployment of the environment, whatever its name (azd names
#      its deployments <env>-<unix time>; docs/deploy.md's az steps name them after the environment).
# Exit codes: 0 done; 2 bad usage; 3 inputs not found; 4 an az command failed (the targets are named);
# 5 the platform feed's preview features are not registered in the subscription (--platform-feed, --agentless).
# Rights needed: docs/deploy.md, "Install the forwarder".
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
FORWARDER_KEYS=(FORWARDER_ARTIFACTS_URL EVENTHUB_NAMESPACE EVENTHUB_NAME VM_IDENTITY_ID VM_IDENTITY_CLIENT_ID
                QUEUE_SERVICE_URI STORAGE_ACCOUNT_ID)
OPTIONAL_KEYS=(PLATFORM_FEED_ENABLED)  # read when present; an older deployment has no such output

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "install-on-vms: $2" >&2; exit "$1"; }
say() { echo "install-on-vms: $*"; }
upper() { printf '%s' "$1" | tr '[:lower:]' '[:upper:]'; }
lower() { printf '%s' "$1" | tr '[:upper:]' '[:lower:]'; }

group="" env_name="${AZURE_ENV_NAME:-}" deployment="" os_flag="" dry_run=0 platform=0 agentless=0 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -g|--resource-group) [ $# -ge 2 ] || die 2 "$1 needs a value"; group="$2"; shift 2 ;;
    -e|--environment) [ $# -ge 2 ] || die 2 "$1 needs a value"; env_name="$2"; shift 2 ;;
    -d|--deployment) [ $# -ge 2 ] || die 2 "$1 needs a value"; deployment="$2"; shift 2 ;;
    --os) [ $# -ge 2 ] || die 2 "$1 needs a value"; os_flag="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --platform-feed) platform=1; shift ;;
    --agentless) agentless=1; platform=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die 2 "unknown option $1 (--help lists them)" ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ -n "$group" ] || die 2 "give the VMs' resource group: -g NAME (--help)"
[ ${#targets[@]} -gt 0 ] || die 2 "give at least one target: vm:NAME, vmss:NAME, avset:NAME or all (--help)"
for target in "${targets[@]}"; do
  case "$target" in
    vm:?*|vmss:?*|avset:?*|all) ;;
    *) die 2 "a target is vm:NAME, vmss:NAME, avset:NAME or all, not '$target'" ;;
  esac
done
# The keys this run needs: the forwarder's unless --agentless; central's identity with the platform feed.
KEYS=()
[ "$agentless" -eq 1 ] || KEYS+=("${FORWARDER_KEYS[@]}")
[ "$platform" -eq 0 ] || KEYS+=(FUNCTION_PRINCIPAL_ID)
case "$os_flag" in ""|Linux|Windows) ;; *) die 2 "--os is Linux or Windows, not '$os_flag'" ;; esac
# Names go into JMESPath queries: azd allows letters, digits and hyphens in environment names.
[[ -z "$env_name" || "$env_name" =~ ^[A-Za-z0-9-]{1,64}$ ]] || die 2 "environment '$env_name': letters, digits and hyphens only"

# ---- inputs: one value per key, the first source that has it wins ----
origins=""
take() {  # SOURCE KEY VALUE
  local var="in_$2"
  [ -z "${!var:-}" ] || return 0
  [ -n "$3" ] && [ "$3" != "None" ] || return 0
  printf -v "$var" '%s' "$3"
  case " $origins " in *" $1 "*) ;; *) origins="$origins $1" ;; esac
}
missing() { local key var; for key in "${KEYS[@]}"; do var="in_$key"; [ -n "${!var:-}" ] || echo "$key"; done; }
is_key() { local key; for key in "${KEYS[@]}" "${OPTIONAL_KEYS[@]}"; do [ "$key" = "$1" ] && return 0; done; return 1; }

from_deployment() {  # NAME: its outputs, matched without regard to case (ARM may return azurE_X for AZURE_X)
  local rows names values i name sep=$'\x1f'
  rows="$(az deployment sub show --name "$1" \
          --query "[keys(properties.outputs), properties.outputs.*.value]" -o tsv)" \
    || die 3 "cannot read the outputs of subscription deployment '$1' (az deployment sub list -o table shows the names)"
  IFS="$sep" read -r -a names <<< "$(sed -n 1p <<< "$rows" | tr '\t' "$sep")"
  IFS="$sep" read -r -a values <<< "$(sed -n 2p <<< "$rows" | tr '\t' "$sep")"
  for i in "${!names[@]}"; do
    name="$(upper "${names[$i]}")"
    if is_key "$name"; then take "deployment:$1" "$name" "${values[$i]:-}"; fi
  done
}

from_azd() {  # the azd environment's values (KEY="value" lines), when there is one
  command -v azd >/dev/null 2>&1 || return 0
  local args=(env get-values) out line key value
  [ -z "$env_name" ] || args+=(--environment "$env_name")
  out="$(cd "$repo" && azd "${args[@]}" 2>/dev/null)" || return 0
  while IFS= read -r line; do
    [[ "$line" =~ ^([A-Za-z_][A-Za-z0-9_]*)=\"(.*)\"$ ]] || continue
    key="${BASH_REMATCH[1]}"
    value="$(printf '%s' "${BASH_REMATCH[2]}" | sed -e 's/\\\(.\)/\1/g')"
    if [ "$key" = AZURE_ENV_NAME ] && [ -z "$env_name" ]; then env_name="$value"; fi
    if is_key "$key"; then take "azd:${env_name:-default}" "$key" "$value"; fi
  done <<< "$out"
}

newest_deployment() {  # the newest successful subscription deployment of $env_name (azd's tag or the parameter)
  az deployment sub list --query "sort_by([?properties.provisioningState=='Succeeded' && (tags.\"azd-env-name\"=='$env_name' || properties.parameters.environmentName.value=='$env_name')], &properties.timestamp)[-1].name" -o tsv
}

for key in "${KEYS[@]}" "${OPTIONAL_KEYS[@]}"; do take "environment" "$key" "${!key:-}"; done
if [ -n "$(missing)" ] && [ -n "$deployment" ]; then from_deployment "$deployment"; fi
if [ -n "$(missing)" ]; then from_azd; fi
if [ -n "$(missing)" ] && [ -n "$env_name" ]; then
  newest="$(newest_deployment)" || die 3 "cannot list the subscription's deployments (az login? az account set?)"
  if [ -n "$newest" ] && [ "$newest" != "None" ]; then from_deployment "$newest"; fi
fi
if [ -n "$(missing)" ]; then
  die 3 "no value for $(missing | tr '\n' ' ')- give -e ENVIRONMENT (azd's or the deployment's environmentName) or -d DEPLOYMENT (az deployment sub list -o table), or set them as environment variables"
fi
say "inputs from:${origins}"

common=(
  artifactsUrl="${in_FORWARDER_ARTIFACTS_URL:-}"
  eventHubNamespace="${in_EVENTHUB_NAMESPACE:-}"
  eventHubName="${in_EVENTHUB_NAME:-}"
  vmIdentityClientId="${in_VM_IDENTITY_CLIENT_ID:-}"
  queueServiceUri="${in_QUEUE_SERVICE_URI:-}"
  storageAccountId="${in_STORAGE_ACCOUNT_ID:-}"
)
# shellcheck source=platform-opt-in.sh
. "$here/platform-opt-in.sh"
[ "$platform" -eq 0 ] || platform_preflight

# ---- the installs ----
run() {  # a command that changes something: printed under --dry-run, run otherwise
  if [ "$dry_run" -eq 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

deployment_name() {  # KIND NAME -> at most 59 characters (ARM allows 64): prefix, part of the name, a hash
  local sum
  sum="$(printf '%s' "$group/$2" | cksum | cut -d' ' -f1)"
  printf 'se-fwd-%s-%s-%s' "$1" "${2:0:36}" "$sum"
}

os_type() {  # QUERY-COMMAND... -> Linux or Windows
  local os="$os_flag"
  [ -n "$os" ] || os="$("$@" -o tsv)" || return 1
  case "$os" in
    Linux|Windows) printf '%s' "$os" ;;
    *) echo "install-on-vms: cannot tell the OS ('$os'): pass --os Linux|Windows" >&2; return 1 ;;
  esac
}

install_vm() {  # NAME: the shared identity (hub, artifacts) + its own system-assigned one (its queue)
  local os
  os="$(os_type az vm show -g "$group" -n "$1" --query storageProfile.osDisk.osType)" || return 1
  run az vm identity assign -g "$group" -n "$1" --identities '[system]' "${in_VM_IDENTITY_ID:-}" -o none || return 1
  run az deployment group create -g "$group" -n "$(deployment_name vm "$1")" \
    -f "$here/install-vm.bicep" -p vmName="$1" osType="$os" "${common[@]}" -o none || return 1
  say "vm:$1 done ($os)"
}

instance_vm_ids() {  # NAME -> the instances' vmIds as a JSON array (GUIDs only)
  local ids id json="" sep=""
  ids="$(az vmss list-instances -g "$group" -n "$1" --query "[].vmId" -o tsv)" || return 1
  while IFS= read -r id; do
    [ -n "$id" ] || continue
    [[ "$id" =~ ^[0-9A-Fa-f-]{36}$ ]] || { echo "install-on-vms: vmss:$1: unexpected vmId '$id'" >&2; return 1; }
    json="$json$sep\"$id\""; sep=","
  done <<< "$ids"
  printf '[%s]' "$json"
}

install_uniform() {  # NAME: the model gets the extension and the identities, then every instance is updated
  local os vm_ids
  os="$(os_type az vmss show -g "$group" -n "$1" --query virtualMachineProfile.storageProfile.osDisk.osType)" \
    || return 1
  run az vmss identity assign -g "$group" -n "$1" --identities '[system]' "${in_VM_IDENTITY_ID:-}" -o none || return 1
  # The instances share the scale set's system-assigned identity: it gets the queues of today's instances.
  vm_ids="$(instance_vm_ids "$1")" || return 1
  run az deployment group create -g "$group" -n "$(deployment_name vmss "$1")" \
    -f "$here/install-vmss.bicep" -p vmssName="$1" osType="$os" "${common[@]}" instanceVmIds="$vm_ids" \
    -o none || return 1
  # '*' (every instance) is a Uniform-only form; with an Automatic or Rolling policy this is a no-op.
  run az vmss update-instances -g "$group" -n "$1" --instance-ids '*' -o none || return 1
  say "vmss:$1 done (Uniform, $os)"
}

flexible_members() {  # NAME -> the names of the VMs whose scale set is NAME (this resource group)
  local vm set
  az vm list -g "$group" --query "[].[name, virtualMachineScaleSet.id]" -o tsv | while IFS=$'\t' read -r vm set; do
    if [ -n "$set" ] && [ "$(lower "${set##*/}")" = "$(lower "$1")" ]; then echo "$vm"; fi
  done
}

install_vmss() {  # NAME
  local mode members vm failed=0
  mode="$(az vmss show -g "$group" -n "$1" --query orchestrationMode -o tsv)" || return 1
  case "$mode" in
    Flexible)
      # Members are VMs: each gets the VM install. A member added later needs this command again.
      members="$(flexible_members "$1")" || return 1
      [ -n "$members" ] || { say "vmss:$1 (Flexible) has no member VM in $group: nothing to do"; return 0; }
      while IFS= read -r vm; do install_vm "$vm" || failed=1; done <<< "$members"
      return "$failed" ;;
    *) install_uniform "$1" ;;  # Uniform (scale sets older than the property report none)
  esac
}

expand_all() {  # every VM of the group, then every Uniform scale set
  local vm set
  az vm list -g "$group" --query "[].name" -o tsv | while IFS= read -r vm; do [ -z "$vm" ] || echo "vm:$vm"; done
  az vmss list -g "$group" --query "[?orchestrationMode!='Flexible'].name" -o tsv \
    | while IFS= read -r set; do [ -z "$set" ] || echo "vmss:$set"; done
}

work=()
for target in "${targets[@]}"; do
  if [ "$target" = all ]; then
    listed="$(expand_all)" || die 4 "cannot list the VMs and scale sets of resource group $group"
    while IFS= read -r item; do [ -z "$item" ] || work+=("$item"); done <<< "$listed"
  else
    work+=("$target")
  fi
done
[ ${#work[@]} -gt 0 ] || { say "no VM or scale set in $group: nothing to do"; exit 0; }

target_vm() {  # NAME: the forwarder (unless --agentless), then the platform opt-in of its owner
  if [ "$agentless" -eq 0 ]; then install_vm "$1" || return 1; fi
  if [ "$platform" -eq 1 ]; then platform_vm "$1" || return 1; fi
}

target_vmss() {
  if [ "$agentless" -eq 0 ]; then install_vmss "$1" || return 1; fi
  if [ "$platform" -eq 1 ]; then platform_vmss "$1" || return 1; fi
}

target_avset() {  # NAME: the set opted in first (it owns its VMs' events), then the forwarder on each member
  local members vm failed=0
  if [ "$platform" -eq 1 ]; then platform_avset "$1" || return 1; fi
  [ "$agentless" -eq 0 ] || return 0
  members="$(avset_members "$1")" || return 1
  [ -n "$members" ] || { say "avset:$1 has no member VM: nothing to install"; return 0; }
  while IFS= read -r vm; do install_vm "$vm" || failed=1; done <<< "$members"
  return "$failed"
}

failures=()
for target in "${work[@]}"; do
  case "$target" in
    vm:*) target_vm "${target#vm:}" || failures+=("$target") ;;
    vmss:*) target_vmss "${target#vmss:}" || failures+=("$target") ;;
    avset:*) target_avset "${target#avset:}" || failures+=("$target") ;;
  esac
done
[ "$platform" -eq 0 ] || platform_hint
if [ ${#failures[@]} -gt 0 ]; then
  die 4 "failed: ${failures[*]} (the az error is above; the other targets are done; run again for these)"
fi
