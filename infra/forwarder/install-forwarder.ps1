<#
.SYNOPSIS
  Installs (or upgrades) the Scheduled Events forwarder on a Windows VM, offline: no PyPI, no Python on the image.

.DESCRIPTION
  Run as Administrator (the CustomScript extension runs as SYSTEM) from the directory holding the bundle:
    powershell -ExecutionPolicy Bypass -File install-forwarder.ps1 -Bundle se-forwarder-windows.zip -ConfigBase64 <b64>
    powershell -ExecutionPolicy Bypass -File install-forwarder.ps1 -Uninstall [-Purge]
  The bundle (make wheelhouse) carries its own interpreter (python\: python.org's embeddable CPython for
  x64, pinned by hash), the wheels for it, pip's wheel, run-forwarder.ps1 and forwarder.md.

  This script is thin on purpose: every decision (paths under Program Files and ProgramData, the config
  file, the ._pth edit, the offline pip install, the ACLs and the task's command line) is the forwarder's
  own `windows-install` command (forwarder/windows_install.py), which the tests run under Wine.
  What stays here is what only Windows' own tools do: unpack, stop the running forwarder, icacls, the
  scheduled task. Step by step: docs/forwarder.md, "Install on one VM by hand".

  Service model: a scheduled task that starts at boot and runs run-forwarder.ps1 as NT AUTHORITY\LOCAL
  SERVICE; run-forwarder.ps1 restarts the forwarder with backoff and writes
  ProgramData\se-forwarder\state\forwarder.log (why not a Windows service: docs/forwarder.md).
  -Uninstall stops and unregisters the task and removes the program and the config the install wrote; the
  outbox (ProgramData\se-forwarder\state) and hooks you added stay unless -Purge.
#>
[CmdletBinding()]
param(
    [string]$Bundle = "",
    [string]$ConfigBase64 = "",
    [string]$ConfigFile = "",
    [switch]$Uninstall,
    [switch]$Purge
)
$ErrorActionPreference = "Stop"
Set-StrictMode -Version Latest

# The installed interpreter: windows_install.layout()'s python_exe (uninstall asks it for the rest).
$Installed = Join-Path $env:ProgramFiles "se-forwarder\python\python.exe"
# Runs forwarder.windows_install from the forwarder's wheel before anything is installed (zip import).
$Bootstrap = "import sys; sys.path.insert(0, sys.argv.pop(1)); from forwarder.windows_install import main; sys.exit(main())"

function Fail([string]$Message) { Write-Error "install-forwarder: error: $Message"; exit 1 }
function Log([string]$Message) { Write-Output "install-forwarder: $Message" }

$principal = New-Object Security.Principal.WindowsPrincipal([Security.Principal.WindowsIdentity]::GetCurrent())
if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) { Fail "run as Administrator" }
if ($Purge -and -not $Uninstall) { Fail "-Purge goes with -Uninstall" }

function Stop-Forwarder($Plan) {
    $task = $Plan.task.name
    if (Get-ScheduledTask -TaskName $task -ErrorAction SilentlyContinue) {
        Stop-ScheduledTask -TaskName $task -ErrorAction SilentlyContinue
    }
    $prefix = $Plan.layout.prefix
    Get-CimInstance Win32_Process -Filter "Name = 'python.exe'" -ErrorAction SilentlyContinue |
        Where-Object { $_.ExecutablePath -like "$prefix*" } |
        ForEach-Object { Stop-Process -Id $_.ProcessId -Force -ErrorAction SilentlyContinue }
}

function Read-Plan([string]$Text) { return ($Text | Out-String | ConvertFrom-Json) }

$work = Join-Path ([IO.Path]::GetTempPath()) ("se-forwarder-" + [Guid]::NewGuid().ToString("N"))
New-Item -ItemType Directory -Path $work | Out-Null
try {
    if ($Uninstall) {
        if (-not (Test-Path $Installed)) { Log "not installed ($Installed absent)"; exit 0 }
        $plan = Read-Plan (& $Installed -m forwarder windows-install plan)
        if ($LASTEXITCODE -ne 0) { Fail "the installed forwarder cannot describe its install" }
        Log "stopping and unregistering the task $($plan.task.name)"
        Stop-Forwarder $plan
        if (Get-ScheduledTask -TaskName $plan.task.name -ErrorAction SilentlyContinue) {
            Unregister-ScheduledTask -TaskName $plan.task.name -Confirm:$false
        }
        # The program removes itself from a copy of its interpreter (a running python.exe cannot be deleted).
        Copy-Item -Recurse $plan.layout.python_dir (Join-Path $work "python")
        $removeArgs = @("uninstall")
        if ($Purge) { $removeArgs += "--purge" }
        & (Join-Path $work "python\python.exe") -m forwarder windows-install @removeArgs
        if ($LASTEXITCODE -ne 0) { Fail "windows-install uninstall failed (exit $LASTEXITCODE)" }
        Log "uninstalled"
        exit 0
    }

    if (-not $Bundle -or -not (Test-Path $Bundle)) { Fail "bundle not found: '$Bundle' (give -Bundle se-forwarder-windows.zip)" }
    if (-not $ConfigBase64 -and -not $ConfigFile) { Fail "give -ConfigBase64 or -ConfigFile" }
    Log "unpacking $Bundle"
    Expand-Archive -Path $Bundle -DestinationPath $work -Force
    $python = Join-Path $work "python\python.exe"
    $wheel = Get-ChildItem -Path (Join-Path $work "wheels") -Filter "scheduled_events_forwarder-*.whl" | Select-Object -First 1
    if (-not (Test-Path $python) -or -not $wheel) { Fail "bundle is incomplete: python\python.exe or the forwarder's wheel missing" }

    $plan = Read-Plan (& $python -c $Bootstrap $wheel.FullName plan)
    if ($LASTEXITCODE -ne 0) { Fail "windows-install plan failed (exit $LASTEXITCODE)" }
    $configArgs = @("--config-file", $ConfigFile)
    if ($ConfigBase64) { $configArgs = @("--config-base64", $ConfigBase64) }
    Log "staging $($plan.stagedPythonDir) (offline, from the bundle's wheels)"
    & $python -c $Bootstrap $wheel.FullName stage --bundle $work @configArgs
    if ($LASTEXITCODE -ne 0) { Fail "windows-install stage failed (exit $LASTEXITCODE)" }

    Stop-Forwarder $plan
    & $python -c $Bootstrap $wheel.FullName activate
    if ($LASTEXITCODE -ne 0) { Fail "windows-install activate failed (exit $LASTEXITCODE)" }

    foreach ($acl in $plan.acl) {
        & $acl[0] $acl[1..($acl.Count - 1)] | Out-Null
        if ($LASTEXITCODE -ne 0) { Fail "$($acl -join ' ') failed (exit $LASTEXITCODE)" }
    }

    $task = $plan.task
    Log "registering the startup task $($task.name) (runs as $($task.account))"
    $action = New-ScheduledTaskAction -Execute $task.execute -Argument $task.argument
    $trigger = New-ScheduledTaskTrigger -AtStartup
    $taskPrincipal = New-ScheduledTaskPrincipal -UserId $task.user -LogonType ServiceAccount -RunLevel Limited
    $settings = New-ScheduledTaskSettingsSet -ExecutionTimeLimit ([TimeSpan]::Zero) -RestartCount 999 `
        -RestartInterval (New-TimeSpan -Minutes 1) -StartWhenAvailable -AllowStartIfOnBatteries `
        -DontStopIfGoingOnBatteries -MultipleInstances IgnoreNew
    Register-ScheduledTask -TaskName $task.name -Action $action -Trigger $trigger -Principal $taskPrincipal `
        -Settings $settings -Description $task.description -Force | Out-Null
    Start-ScheduledTask -TaskName $task.name
    Start-Sleep -Seconds 5
    $state = (Get-ScheduledTask -TaskName $task.name).State
    if ($state -ne "Running") { Fail "task $($task.name) is $state; see $($plan.layout.log_path)" }
    Log "done: task $($task.name) is running"
} finally {
    Remove-Item -Recurse -Force $work -ErrorAction SilentlyContinue
}
