#!/bin/sh
# azd's prepackage hook (azure.yaml): the on-call console's @azure/msal-browser, as package-lock.json pins
# it, into central/console/vendor/ so it ships in the Functions package (.funcignore keeps node_modules out).
# Exit codes: 0 copied, 2 not installed or another version (tools/console_vendor.py says what to run).
set -eu
cd "$(dirname "$0")/../.."
if [ ! -f node_modules/@azure/msal-browser/package.json ]; then
  npm ci --no-audit --no-fund --loglevel=error --omit=dev
fi
exec python3 -m tools.console_vendor
