# Sourced by install-on-vms.sh (--platform-feed, --agentless): opts the resource that owns a VM's scheduled
# events into the platform feed and lets central approve them through ARM (issue 23; docs/deploy.md,
# "The platform feed"). Uses the caller's group, run, say and in_FUNCTION_PRINCIPAL_ID.
#
# The owner: a VM in an availability set -> the set; a Flexible scale set member -> the scale set; a
# Uniform scale set -> itself; else the VM. Azure takes scheduledEventsPolicy only there (a VM in a set
# cannot set its own), and ARM acknowledges an event under that resource, so the role goes there too.
#   1. PATCH properties.scheduledEventsPolicy.scheduledEventsAdditionalPublishingTargets
#      .eventGridAndResourceGraph {enable: true, scheduledEventsApiVersion: "2020-07-01"} (Compute api-version
#      2025-04-01, the first with scheduledEventsApiVersion; body: platform-opt-in.json). A PATCH names
#      only that branch: userInitiatedReboot/Redeploy and allInstancesDown stay as they are.
#   2. Scheduled Events Contributor (b67fe603-310e-4889-b9ee-8257d09d353d) for central's Function app
#      identity (FUNCTION_PRINCIPAL_ID) at that resource: never the resource group, never the subscription.
COMPUTE_API_VERSION=2025-04-01
SCHEDULED_EVENTS_CONTRIBUTOR=b67fe603-310e-4889-b9ee-8257d09d353d  # Scheduled Events Contributor
FEATURES="Microsoft.Compute/SendScheduledEventsPolicy Microsoft.Maintenance/ScheduledEventsActivity"
opted_in=""  # owners done in this run (newline-separated ids, lower case; bash 3.2 has no maps)

platform_preflight() {  # both preview features registered, else one actionable line (exit 5)
  local feature state
  for feature in $FEATURES; do
    state="$(az feature show --namespace "${feature%%/*}" --name "${feature#*/}" --query properties.state -o tsv)" \
      || die 5 "cannot read feature $feature (az login? az account set to the VMs' subscription?)"
    [ "$state" = Registered ] || die 5 "feature $feature is '${state:-NotRegistered}', not Registered: az feature register --namespace ${feature%%/*} --name ${feature#*/}, wait for Registered, then az provider register -n ${feature%%/*} (docs/deploy.md, \"The platform feed\")"
  done
  if [ "$(lower "${in_PLATFORM_FEED_ENABLED:-}")" = false ]; then
    echo "install-on-vms: warning: the deployment's platform feed is off (platformFeedEnabled=false): the opted-in resources publish to Event Grid, but central hears nothing until it is on" >&2
  fi
}

vm_owner() {  # NAME -> the ARM id of the resource that owns the VM's events (the first that is set)
  az vm show -g "$group" -n "$1" --query "availabilitySet.id || virtualMachineScaleSet.id || id" -o tsv
}

opt_in() {  # ARM-ID: the policy, then central's role there (each once per run)
  local key
  key="$(lower "$1")"
  case "$opted_in" in *"|$key|"*) return 0 ;; esac
  [[ "$1" =~ ^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/(virtualMachines|virtualMachineScaleSets|availabilitySets)/[^/]+$ ]] \
    || { echo "install-on-vms: not a VM, scale set or availability set id: '$1'" >&2; return 1; }
  run az rest --method patch --url "$1?api-version=$COMPUTE_API_VERSION" \
    --body "@$here/platform-opt-in.json" -o none || return 1
  run az role assignment create --assignee-object-id "$in_FUNCTION_PRINCIPAL_ID" \
    --assignee-principal-type ServicePrincipal --role "$SCHEDULED_EVENTS_CONTRIBUTOR" --scope "$1" -o none \
    || return 1
  opted_in="$opted_in|$key|"
  say "platform feed: ${1#*/providers/Microsoft.Compute/} opted in; central may approve its events through ARM"
}

platform_vm() { local owner; owner="$(vm_owner "$1")" || return 1; opt_in "$owner"; }

platform_vmss() {
  local id
  id="$(az vmss show -g "$group" -n "$1" --query id -o tsv)" || return 1
  opt_in "$id"
}

platform_avset() {
  local id
  id="$(az vm availability-set show -g "$group" -n "$1" --query id -o tsv)" || return 1
  opt_in "$id"
}

avset_members() {  # NAME -> the names of its VMs (an availability set's VMs are in its resource group)
  local ids id
  ids="$(az vm availability-set show -g "$group" -n "$1" --query "virtualMachines[].id" -o tsv)" || return 1
  while IFS= read -r id; do [ -z "$id" ] || echo "${id##*/}"; done <<< "$ids"
}

platform_hint() {  # after the run: the scope that PLATFORM_CONFIRM_SCOPES should hold for these forwarders
  [ -n "$opted_in" ] && [ "$agentless" -eq 0 ] || return 0
  local sub
  sub="$(az account show --query id -o tsv 2>/dev/null)" || return 0
  say "platform feed: list /subscriptions/$sub/resourceGroups/$group in platformConfirmScopes (SE_PLATFORM_CONFIRM_SCOPES) so central confirms these forwarders' claims against the feed"
}
