<#
.SYNOPSIS
  Installs (or upgrades) the Scheduled Events forwarder on a Windows VM, offline: no PyPI.

.DESCRIPTION
  Run as Administrator (the CustomScript extension runs as SYSTEM) from the directory holding the bundle:
    powershell -ExecutionPolicy Bypass -File install-forwarder.ps1 -Bundle se-forwarder-windows.zip -ConfigBase64 <b64>
    powershell -ExecutionPolicy Bypass -File install-forwarder.ps1 -Uninstall [-Purge]
  The bundle (make wheelhouse) holds wheels\, requirements-vm.txt, run-forwarder.ps1 and forwarder.md.
  -Uninstall stops and unregisters the task, stops the forwarder and removes the program and the config the
  install wrote; the outbox (ProgramData\se-forwarder\state) and hooks you added stay unless -Purge.
  Step by step: docs/forwarder.md, "Install on one VM by hand" (untested on Windows).

  Service model, without NSSM or pywin32: a scheduled task that starts at boot and runs
  run-forwarder.ps1 as NT AUTHORITY\LOCAL SERVICE (no admin rights, no password). run-forwarder.ps1
  is the small service host: it starts se-forwarder.exe, and when it exits restarts it with backoff
  (5 s doubling to 5 min), so a crash never leaves the VM without a forwarder. The task itself also
  restarts on failure and has no run-time limit. Stopping the task ends the process abruptly; the
  forwarder's outbox is durable (SQLite), so nothing observed is lost.

  Needs Python >= 3.9 (x64) on the VM (your image, or winget/the python.org installer); pass -Python
  if it is not on PATH.
#>
[CmdletBinding()]
param(
    [string]$Bundle = "",
    [string]$ConfigBase64 = "",
    [string]$ConfigFile = "",
    [string]$Python = "",
    [switch]$Uninstall,
    [switch]$Purge
)
$ErrorActionPreference = "Stop"
Set-StrictMode -Version Latest

$Prefix = Join-Path $env:ProgramFiles "se-forwarder"
$DataDir = Join-Path $env:ProgramData "se-forwarder"
$StateDir = Join-Path $DataDir "state"
$HookDir = Join-Path $DataDir "hooks"
$ConfigPath = Join-Path $DataDir "config.json"
$TaskName = "se-forwarder"
$ServiceAccount = "NT AUTHORITY\LOCAL SERVICE"

function Fail([string]$Message) { Write-Error "install-forwarder: error: $Message"; exit 1 }
function Log([string]$Message) { Write-Output "install-forwarder: $Message" }

$principal = New-Object Security.Principal.WindowsPrincipal([Security.Principal.WindowsIdentity]::GetCurrent())
if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) { Fail "run as Administrator" }
if ($Purge -and -not $Uninstall) { Fail "-Purge goes with -Uninstall" }

function Stop-Forwarder {
    if (Get-ScheduledTask -TaskName $TaskName -ErrorAction SilentlyContinue) {
        Stop-ScheduledTask -TaskName $TaskName -ErrorAction SilentlyContinue
    }
    Get-CimInstance Win32_Process -Filter "Name = 'se-forwarder.exe'" -ErrorAction SilentlyContinue |
        Where-Object { $_.ExecutablePath -like "$Prefix*" } |
        ForEach-Object { Stop-Process -Id $_.ProcessId -Force -ErrorAction SilentlyContinue }
}

if ($Uninstall) {
    # The reverse of the install below; safe to run twice.
    Log "stopping and unregistering the task $TaskName"
    Stop-Forwarder
    if (Get-ScheduledTask -TaskName $TaskName -ErrorAction SilentlyContinue) {
        Unregister-ScheduledTask -TaskName $TaskName -Confirm:$false
    }
    Log "removing $Prefix"
    if (Test-Path $Prefix) { Remove-Item -Recurse -Force $Prefix }
    if ($Purge) {
        Log "-Purge: removing $DataDir (config, hooks and the outbox: unsent envelopes are lost)"
        if (Test-Path $DataDir) { Remove-Item -Recurse -Force $DataDir }
    } else {
        # What the install wrote: config.json and the *.example hooks. Hooks someone added and the outbox stay.
        if (Test-Path $ConfigPath) { Remove-Item -Force $ConfigPath }
        if (Test-Path $HookDir) {
            Get-ChildItem -Path $HookDir -Recurse -File -Filter "*.example" | Remove-Item -Force
        }
        Log "kept $StateDir (the outbox) and any hooks you added; -Purge removes them"
    }
    Log "uninstalled"
    exit 0
}

if (-not $Bundle -or -not (Test-Path $Bundle)) { Fail "bundle not found: '$Bundle' (give -Bundle se-forwarder-windows.zip)" }
if (-not $ConfigBase64 -and -not $ConfigFile) { Fail "give -ConfigBase64 or -ConfigFile" }

if (-not $Python) {
    $found = Get-Command python.exe -ErrorAction SilentlyContinue
    if (-not $found) { $found = Get-Command py.exe -ErrorAction SilentlyContinue }
    if (-not $found) { Fail "Python >= 3.9 not found: install it (x64) or pass -Python C:\path\to\python.exe" }
    $Python = $found.Source
}
& $Python -c "import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)"
if ($LASTEXITCODE -ne 0) { Fail "$Python is older than 3.9" }

$work = Join-Path ([IO.Path]::GetTempPath()) ("se-forwarder-" + [Guid]::NewGuid().ToString("N"))
New-Item -ItemType Directory -Path $work | Out-Null
try {
    Log "unpacking $Bundle"
    Expand-Archive -Path $Bundle -DestinationPath $work -Force
    foreach ($need in @("wheels", "requirements-vm.txt", "run-forwarder.ps1")) {
        if (-not (Test-Path (Join-Path $work $need))) { Fail "bundle is incomplete: $need missing" }
    }

    Log "installing into $Prefix (offline, from the bundle's wheels)"
    New-Item -ItemType Directory -Force -Path $Prefix, $DataDir, $StateDir, $HookDir, `
        (Join-Path $HookDir "pre-approve.d"), (Join-Path $HookDir "post-event.d") | Out-Null
    $venvNew = Join-Path $Prefix "venv.new"
    $venv = Join-Path $Prefix "venv"
    if (Test-Path $venvNew) { Remove-Item -Recurse -Force $venvNew }
    $wheels = Join-Path $Prefix "wheels"
    if (Test-Path $wheels) { Remove-Item -Recurse -Force $wheels }
    Copy-Item -Recurse (Join-Path $work "wheels") $wheels
    Copy-Item -Force (Join-Path $work "requirements-vm.txt") (Join-Path $Prefix "requirements-vm.txt")
    Copy-Item -Force (Join-Path $work "run-forwarder.ps1") (Join-Path $Prefix "run-forwarder.ps1")
    if (Test-Path (Join-Path $work "forwarder.md")) {
        Copy-Item -Force (Join-Path $work "forwarder.md") (Join-Path $Prefix "forwarder.md")
    }
    & $Python -m venv $venvNew
    if ($LASTEXITCODE -ne 0) { Fail "python -m venv failed" }
    & (Join-Path $venvNew "Scripts\python.exe") -m pip install --quiet --no-index --disable-pip-version-check `
        --find-links $wheels -r (Join-Path $Prefix "requirements-vm.txt") scheduled-events-forwarder
    if ($LASTEXITCODE -ne 0) { Fail "offline pip install failed (does the bundle match this Python version?)" }

    Log "writing $ConfigPath"
    if ($ConfigBase64) {
        $json = [Text.Encoding]::UTF8.GetString([Convert]::FromBase64String($ConfigBase64))
    } else {
        $json = Get-Content -Raw -Path $ConfigFile
    }
    $null = $json | ConvertFrom-Json   # throws on invalid JSON
    [IO.File]::WriteAllText($ConfigPath, $json, (New-Object Text.UTF8Encoding($false)))

    # Stop the running forwarder before swapping its venv.
    Stop-Forwarder
    if (Test-Path $venv) { Remove-Item -Recurse -Force $venv }
    Move-Item $venvNew $venv
    # Documented example hooks as *.example files, never run until copied without the suffix.
    & (Join-Path $venv "Scripts\python.exe") -c "import sys; from forwarder.hooks import install_examples; install_examples(sys.argv[1])" $HookDir
    if ($LASTEXITCODE -ne 0) { Fail "installing the example hooks failed" }

    # ACLs by SID (names are localized): SYSTEM S-1-5-18, Administrators S-1-5-32-544, LOCAL SERVICE
    # S-1-5-19. Program and config read-only for the service account; state writable by it.
    & icacls $Prefix /inheritance:r /grant:r "*S-1-5-18:(OI)(CI)F" "*S-1-5-32-544:(OI)(CI)F" "*S-1-5-19:(OI)(CI)RX" | Out-Null
    & icacls $DataDir /inheritance:r /grant:r "*S-1-5-18:(OI)(CI)F" "*S-1-5-32-544:(OI)(CI)F" "*S-1-5-19:(OI)(CI)RX" | Out-Null
    & icacls $StateDir /grant:r "*S-1-5-19:(OI)(CI)M" | Out-Null

    Log "registering the startup task $TaskName (runs as $ServiceAccount)"
    $host_ps1 = Join-Path $Prefix "run-forwarder.ps1"
    $action = New-ScheduledTaskAction -Execute "powershell.exe" `
        -Argument "-NoProfile -NonInteractive -ExecutionPolicy Bypass -File `"$host_ps1`" -Prefix `"$Prefix`" -Config `"$ConfigPath`" -StateDir `"$StateDir`""
    $trigger = New-ScheduledTaskTrigger -AtStartup
    $taskPrincipal = New-ScheduledTaskPrincipal -UserId "LOCAL SERVICE" -LogonType ServiceAccount -RunLevel Limited
    $settings = New-ScheduledTaskSettingsSet -ExecutionTimeLimit ([TimeSpan]::Zero) -RestartCount 999 `
        -RestartInterval (New-TimeSpan -Minutes 1) -StartWhenAvailable -AllowStartIfOnBatteries `
        -DontStopIfGoingOnBatteries -MultipleInstances IgnoreNew
    Register-ScheduledTask -TaskName $TaskName -Action $action -Trigger $trigger -Principal $taskPrincipal `
        -Settings $settings -Description "Azure Scheduled Events forwarder (service host: run-forwarder.ps1)" -Force | Out-Null
    Start-ScheduledTask -TaskName $TaskName
    Start-Sleep -Seconds 5
    $state = (Get-ScheduledTask -TaskName $TaskName).State
    if ($state -ne "Running") { Fail "task $TaskName is $state; see $StateDir\forwarder.log" }
    Log "done: task $TaskName is running"
} finally {
    Remove-Item -Recurse -Force $work -ErrorAction SilentlyContinue
}
