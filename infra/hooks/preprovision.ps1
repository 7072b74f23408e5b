<#
.SYNOPSIS
  azd's preprovision hook on Windows (azure.yaml): the policy about to be deployed must pass
  `se-policy check`, or nothing is provisioned. Same rules as preprovision.sh: infra/policy.json, or
  SE_POLICY_JSON when set. Exit codes: 0 valid, 2 invalid policy, 3 se-policy not installed.
  Parsed in make test (tree-sitter-powershell); not run on Windows by the project's tests.
#>
$ErrorActionPreference = "Stop"
$repo = (Resolve-Path (Join-Path $PSScriptRoot "..\..")).Path
$checker = (Get-Command se-policy -ErrorAction SilentlyContinue).Source
if (-not $checker) {
    $local = Join-Path $repo ".venv\Scripts\se-policy.exe"
    if (Test-Path $local) { $checker = $local }
}
if (-not $checker) {
    [Console]::Error.WriteLine("preprovision: se-policy not found: run 'pip install ./ops' in $repo so the policy can be checked before provisioning")
    exit 3
}
if ($env:SE_POLICY_JSON) {
    $what = "SE_POLICY_JSON"
    $env:SE_POLICY_JSON | & $checker check "-"
} else {
    $what = Join-Path $repo "infra\policy.json"
    & $checker check $what
}
if ($LASTEXITCODE -ne 0) {
    [Console]::Error.WriteLine("preprovision: the policy in $what does not pass se-policy check (above); fix it, nothing was provisioned")
    exit 2
}
Write-Output "preprovision: policy OK ($what)"
if ($env:SE_POLICY_SHADOW_JSON) {
    $env:SE_POLICY_SHADOW_JSON | & $checker check "-"
    if ($LASTEXITCODE -ne 0) {
        [Console]::Error.WriteLine("preprovision: the shadow policy in SE_POLICY_SHADOW_JSON does not pass se-policy check (above); nothing was provisioned")
        exit 2
    }
    Write-Output "preprovision: shadow policy OK (SE_POLICY_SHADOW_JSON)"
}
# Operators sign in with Entra ID: the app registration is made by infra/hooks/operator-app.sh (az CLI in
# Git Bash or WSL), or by hand (docs/deploy.md); either way the deployment needs its client id.
if (-not $env:SE_OPERATOR_API_CLIENT_ID) {
    [Console]::Error.WriteLine("preprovision: SE_OPERATOR_API_CLIENT_ID is not set: run infra/hooks/operator-app.sh (Git Bash or WSL) or create the operator API app registration (docs/deploy.md) and 'azd env set SE_OPERATOR_API_CLIENT_ID <client id>'")
    exit 4
}
