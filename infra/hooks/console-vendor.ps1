<#
.SYNOPSIS
  azd's prepackage hook on Windows (azure.yaml): the on-call console's @azure/msal-browser, as
  package-lock.json pins it, into central/console/vendor/ so it ships in the Functions package. Same as
  console-vendor.sh. Exit codes: 0 copied, 2 not installed or another version.
  Parsed in make test (tree-sitter-powershell); not run on Windows by the project's tests.
#>
$ErrorActionPreference = "Stop"
Set-Location (Resolve-Path (Join-Path $PSScriptRoot "..\..")).Path
if (-not (Test-Path "node_modules\@azure\msal-browser\package.json")) {
    & npm ci "--no-audit" "--no-fund" "--loglevel=error" "--omit=dev"
}
& python -m tools.console_vendor
exit $LASTEXITCODE
