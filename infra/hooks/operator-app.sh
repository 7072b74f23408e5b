#!/bin/sh
# The operator API's Entra app registration (docs/deploy.md, "Operators sign in"), run by preprovision.sh.
# - SE_OPERATOR_API_CLIENT_ID set: that registration is used as it is (you made it, or a previous run did).
# - unset: a single-tenant registration "se-operator-api-<env>" is found or created, with the app roles
#   Operator and Reader (operator-app-roles.json; fixed ids, so assignments survive a re-run), the
#   identifier URI api://<client id>, and a service principal that requires an assignment (nobody
#   without a role gets a token). Its client id is saved with `azd env set SE_OPERATOR_API_CLIENT_ID`.
# - then each object id in SE_OPERATOR_PRINCIPAL_IDS / SE_READER_PRINCIPAL_IDS (comma-separated users,
#   groups or service principals) is given that app role, once.
# - with SE_CONSOLE_URL (infra's output, https://<app host>/api/console/; azd passes it to the postprovision
#   run), the registration gets it as a single-page-application redirect URI, once: the on-call console signs
#   in there with @azure/msal-browser (auth code + PKCE; docs/console.md).
# Needs: creating: Application Developer (or Application.ReadWrite.OwnedBy); assigning roles: owner of
# the service principal (a creator is) or Cloud Application Administrator. Without them, create the
# registration by hand and set SE_OPERATOR_API_CLIENT_ID (docs/deploy.md).
# Exit codes: 0 done, 4 az missing or not signed in, 5 Entra refused (the message says which step).
set -eu
here="$(cd "$(dirname "$0")" && pwd)"

if [ -n "${SE_OPERATOR_API_CLIENT_ID:-}" ] && [ -z "${SE_OPERATOR_PRINCIPAL_IDS:-}${SE_READER_PRINCIPAL_IDS:-}${SE_CONSOLE_URL:-}" ]; then
  echo "operator-app: operator API api://$SE_OPERATOR_API_CLIENT_ID (given; no role assignments asked for)"
  exit 0
fi
if ! command -v az >/dev/null 2>&1; then
  echo "operator-app: the az CLI is not installed; install it and 'az login', or set SE_OPERATOR_API_CLIENT_ID" >&2
  exit 4
fi
fail() { echo "operator-app: $1 (docs/deploy.md, 'Operators sign in')" >&2; exit 5; }

client="${SE_OPERATOR_API_CLIENT_ID:-}"
if [ -z "$client" ]; then
  name="se-operator-api-${AZURE_ENV_NAME:-scheduled-events}"
  client="$(az ad app list --display-name "$name" --query "[0].appId" -o tsv)" || fail "cannot list app registrations (az login?)"
  if [ -z "$client" ]; then
    client="$(az ad app create --display-name "$name" --sign-in-audience AzureADMyOrg \
      --app-roles "@$here/operator-app-roles.json" --query appId -o tsv)" \
      || fail "cannot create app registration $name: you need the Application Developer role, or set SE_OPERATOR_API_CLIENT_ID"
    echo "operator-app: created app registration $name ($client)"
  fi
  az ad app update --id "$client" --identifier-uris "api://$client" >/dev/null || fail "cannot set api://$client on $client"
  if command -v azd >/dev/null 2>&1; then
    azd env set SE_OPERATOR_API_CLIENT_ID "$client" >/dev/null
  fi
  export SE_OPERATOR_API_CLIENT_ID="$client"
fi

sp="$(az ad sp list --filter "appId eq '$client'" --query "[0].id" -o tsv)" || fail "cannot read the service principal of $client"
if [ -z "$sp" ]; then
  sp="$(az ad sp create --id "$client" --query id -o tsv)" || fail "cannot create the service principal of $client"
fi
az ad sp update --id "$sp" --set appRoleAssignmentRequired=true >/dev/null || fail "cannot require role assignment on $sp"

assign() {  # $1 role value, $2 comma-separated object ids
  [ -n "$2" ] || return 0
  role_id="$(az ad sp show --id "$sp" --query "appRoles[?value=='$1'].id | [0]" -o tsv)" || fail "cannot read the app roles of $sp"
  [ -n "$role_id" ] || fail "the app registration $client has no app role $1 (operator-app-roles.json)"
  for principal in $(printf '%s' "$2" | tr ',' ' '); do
    have="$(az rest --method GET --uri "https://graph.microsoft.com/v1.0/servicePrincipals/$sp/appRoleAssignedTo" \
      --query "value[?principalId=='$principal' && appRoleId=='$role_id'] | length(@)" -o tsv)" || fail "cannot read role assignments of $sp"
    if [ "$have" = "0" ]; then
      az rest --method POST --uri "https://graph.microsoft.com/v1.0/servicePrincipals/$sp/appRoleAssignedTo" \
        --body "{\"principalId\": \"$principal\", \"resourceId\": \"$sp\", \"appRoleId\": \"$role_id\"}" >/dev/null \
        || fail "cannot give $principal the app role $1: you must own $sp or be Cloud Application Administrator"
      echo "operator-app: $principal is now $1"
    fi
  done
}
assign Operator "${SE_OPERATOR_PRINCIPAL_IDS:-}"
assign Reader "${SE_READER_PRINCIPAL_IDS:-}"

if [ -n "${SE_CONSOLE_URL:-}" ]; then  # the console's SPA redirect URI, added to those already there
  case "$SE_CONSOLE_URL" in https://*) ;; *) fail "SE_CONSOLE_URL must be https://<app host>/api/console/, not $SE_CONSOLE_URL" ;; esac
  have="$(az ad app show --id "$client" --query "spa.redirectUris" -o json)" || fail "cannot read the redirect URIs of $client"
  body="$(printf '%s' "$have" | SE_CONSOLE_URL="$SE_CONSOLE_URL" python3 -c 'import json, os, sys
text = sys.stdin.read().strip()
uris = (json.loads(text) if text else None) or []
url = os.environ["SE_CONSOLE_URL"]
print("" if url in uris else json.dumps({"spa": {"redirectUris": uris + [url]}}))')" || fail "cannot read the redirect URIs of $client"
  if [ -n "$body" ]; then
    az rest --method PATCH --uri "https://graph.microsoft.com/v1.0/applications(appId='$client')" --body "$body" >/dev/null \
      || fail "cannot add the console's redirect URI $SE_CONSOLE_URL to $client: you must own it or be Cloud Application Administrator"
    echo "operator-app: the console signs in at $SE_CONSOLE_URL (SPA redirect URI)"
  fi
fi
echo "operator-app: operator API api://$client (SE_OPERATOR_API_CLIENT_ID)"
