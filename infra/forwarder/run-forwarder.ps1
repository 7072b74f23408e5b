<#
.SYNOPSIS
  The forwarder's service host on Windows: runs se-forwarder and restarts it with backoff when it exits.

.DESCRIPTION
  Started at boot by the "se-forwarder" scheduled task as NT AUTHORITY\LOCAL SERVICE (install-forwarder.ps1).
  Output goes to <StateDir>\forwarder.log (rotated at 10 MB). Backoff: 5 s after a quick exit, doubling
  to 5 min; reset after the forwarder has run 10 minutes.
  Exit codes 2 (configuration error) and 8 (IMDS keeps refusing the configured request) are not
  restarted: retrying cannot help. The reason is the last line se-forwarder wrote to the log; this host
  then exits 0, so the task's own restart-on-failure does not loop either. Fix the configuration and
  start the task again (Start-ScheduledTask se-forwarder).
#>
[CmdletBinding()]
param(
    [Parameter(Mandatory = $true)][string]$Python,
    [Parameter(Mandatory = $true)][string]$Config,
    [Parameter(Mandatory = $true)][string]$StateDir
)
$ErrorActionPreference = "Continue"
$log = Join-Path $StateDir "forwarder.log"
$env:SE_FORWARDER_STATE_DIR = $StateDir
$env:PYTHONUNBUFFERED = "1"
$delay = 5
$NoRestart = @(2, 8)   # se-forwarder: configuration error; IMDS refuses the configured request
while ($true) {
    # 10mb = 10MB in PowerShell; the lower-case form is the one tree-sitter-powershell (make test) reads as a number.
    if ((Test-Path $log) -and ((Get-Item $log).Length -gt 10mb)) { Move-Item -Force $log "$log.1" }
    $started = Get-Date
    # windows_install.daemon_command(): the bundle's own interpreter, no other Python on the VM
    & $Python -m forwarder run --config $Config *>> $log
    $code = $LASTEXITCODE
    $ran = ((Get-Date) - $started).TotalSeconds
    if ($NoRestart -contains $code) {
        Add-Content -Path $log -Value ("{0:o} run-forwarder: se-forwarder exited with {1} after {2:n0} s: not restarting (fix the configuration, then Start-ScheduledTask se-forwarder)" -f (Get-Date), $code, $ran)
        exit 0
    }
    if ($ran -gt 600) { $delay = 5 }
    Add-Content -Path $log -Value ("{0:o} run-forwarder: se-forwarder exited with {1} after {2:n0} s; restarting in {3} s" -f (Get-Date), $code, $ran, $delay)
    Start-Sleep -Seconds $delay
    $delay = [Math]::Min($delay * 2, 300)
}
