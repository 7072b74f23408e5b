#!/bin/sh
# azd's preprovision hook (azure.yaml): the policy about to be deployed must pass `se-policy check`, or
# nothing is provisioned. The policy is infra/policy.json, or SE_POLICY_JSON when set (the same choice
# infra/main.bicepparam makes). The az CLI steps in docs/deploy.md run the same script.
# Then infra/hooks/operator-app.sh: the operator API's Entra app registration and its app roles.
# Exit codes: 0 valid (warnings are printed), 2 invalid policy, 3 se-policy not installed, 4-5 operator-app.sh.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

if command -v se-policy >/dev/null 2>&1; then
  checker="se-policy"
elif [ -x "$repo/.venv/bin/se-policy" ]; then
  checker="$repo/.venv/bin/se-policy"
else
  echo "preprovision: se-policy not found: run 'make bootstrap' in $repo (or 'pip install ./ops') so the policy can be checked before provisioning" >&2
  exit 3
fi

if [ -n "${SE_POLICY_JSON:-}" ]; then
  what="SE_POLICY_JSON"
  status=0
  printf '%s' "$SE_POLICY_JSON" | "$checker" check - || status=$?
else
  what="$repo/infra/policy.json"
  status=0
  "$checker" check "$what" || status=$?
fi
if [ "$status" -ne 0 ]; then
  echo "preprovision: the policy in $what does not pass se-policy check (above); fix it, nothing was provisioned" >&2
  exit 2
fi
if [ -n "${SE_POLICY_SHADOW_JSON:-}" ]; then
  status=0
  printf '%s' "$SE_POLICY_SHADOW_JSON" | "$checker" check - || status=$?
  if [ "$status" -ne 0 ]; then
    echo "preprovision: the shadow policy in SE_POLICY_SHADOW_JSON does not pass se-policy check (above); nothing was provisioned" >&2
    exit 2
  fi
  echo "preprovision: shadow policy OK (SE_POLICY_SHADOW_JSON)"
fi
echo "preprovision: policy OK ($what)"
# Operators sign in with Entra ID: the operator API's app registration and its app roles.
"$here/operator-app.sh"
