#Requires -Version 5.1
#Requires -RunAsAdministrator
<#
.SYNOPSIS
    Install, update or remove the maintenance-bridge agent as the Windows service mbridge-agent.

.DESCRIPTION
    Creates a Python virtualenv under -InstallDir from -Package (the agent's artifact, or with pip)
    and runs `mbridge agent` as a service. The agent is a console program: it never talks to the Service
    Control Manager, so registering mbridge.exe itself with New-Service would have the SCM kill
    it after 30 s (error 1053). WinSW (https://github.com/winsw/winsw, release v2.12.0,
    WinSW-x64.exe) is the service wrapper: it answers the SCM, starts `mbridge.exe agent`,
    passes the settings as environment variables, stops the agent with Ctrl+C (the agent then
    flushes its outbox for up to 10 s), restarts it when it fails and rotates its log.

    WinSW is downloaded from -WinSWUrl (or copied from -WinSWPath) and must match -WinSWSha256,
    which has no default on purpose: it is the hash you verified yourself, so that a replaced
    download cannot run as a service.

    The service runs as the virtual account NT SERVICE\mbridge-agent (least privilege: no
    password, no rights beyond those granted here; it reaches the network as the computer,
    which is all the metadata service and the VM's managed identity or service account need).
    -ServiceAccount LocalSystem is there for hosts where virtual accounts are restricted by
    policy. The state directory is readable only by SYSTEM, Administrators and the service.

    Safe to run again: an existing service is stopped and reinstalled with the new settings;
    the virtualenv is rebuilt only when -Package changed (or with -Force). -Uninstall removes it.

    -Package must name one exact package, by the rules of install-agent.sh (Linux):
      - the agent's artifact (make agent-artifact: one PEX file holding the agent and the locked
        wheels of its dependencies, Windows x64 included) and its SHA-256, as #sha256=<hex> after
        the URL or -PackageSha256. The file is downloaded into the install directory and its
        SHA-256 compared before anything runs from it; then `PEX_TOOLS=1 python <file> venv`
        makes the virtualenv from the wheels inside: no index, no pip, nothing else downloaded.
        pex unpacks it into paths longer than 260 characters, so Windows long paths must be
        enabled (LongPathsEnabled); the script says so and stops before changing anything.
      - or, with pip: a pinned version of the agent's extra from the index -IndexUrl names, or a
        wheel URL with its SHA-256 (pip checks it), whose dependencies come from the index.
    Anything else is refused: a bare name installs whatever an index serves under it, and the
    public index holds no package of this project.

.EXAMPLE
    # Azure VM, Service Bus through the VM's user-assigned managed identity; commands signed with
    # the functions' key (its public key: output agent_verify_key / parameter agentVerifyKey)
    .\install-agent.ps1 -Cloud azure `
        -Package 'https://mystore.blob.core.windows.net/agent/mbridge-agent-servicebus-0.1.0.pex#sha256=<hex of its .sha256 file>' `
        -ServiceBusNamespace mybus.servicebus.windows.net -ClientId 00000000-0000-0000-0000-000000000000 `
        -VerifyKey <the functions' public key, one line> `
        -WinSWSha256 <the SHA-256 of WinSW-x64.exe v2.12.0 that you verified>

.EXAMPLE
    # GCE VM, Pub/Sub through the VM's service account; the artifact and WinSW copied beforehand
    .\install-agent.ps1 -Cloud gce -PubSubProject my-project `
        -Package file:///C:/packages/mbridge-agent-pubsub-0.1.0.pex -PackageSha256 <the artifact's SHA-256> `
        -VerifyKey <the functions' public key> -WinSWPath C:\packages\WinSW-x64.exe -WinSWSha256 <hash>

.EXAMPLE
    # with pip, from your own index (for development)
    .\install-agent.ps1 -Cloud azure -Package 'maintenance-bridge[agent-servicebus]==0.1.0' `
        -IndexUrl https://pypi.example.internal/simple -ServiceBusNamespace mybus.servicebus.windows.net `
        -VerifyKey <the functions' public key> -WinSWSha256 <hash>

.EXAMPLE
    .\install-agent.ps1 -Uninstall -RemoveState
#>
[CmdletBinding(DefaultParameterSetName = 'Install')]
param(
    # Which metadata service to watch (MBRIDGE_CLOUD).
    [Parameter(Mandatory = $true, ParameterSetName = 'Install')]
    [ValidateSet('azure', 'gce')]
    [string] $Cloud,

    # MBRIDGE_TRANSPORT; default servicebus on Azure, pubsub on GCE.
    [Parameter(ParameterSetName = 'Install')]
    [ValidateSet('servicebus', 'pubsub', 'local', 'jsonl')]
    [string] $Transport,

    # https://.../mbridge-agent-servicebus-X.Y.Z.pex#sha256=<hex> (the agent's artifact; or the hash in
    # -PackageSha256); with pip: maintenance-bridge[agent-servicebus]==X.Y.Z (with -IndexUrl), or
    # maintenance-bridge[agent-servicebus] @ https://.../maintenance_bridge-X.Y.Z-py3-none-any.whl (with its hash).
    [Parameter(Mandatory = $true, ParameterSetName = 'Install')]
    [ValidateNotNullOrEmpty()]
    [string] $Package,

    # The index that publishes the pinned version (pip --index-url); the artifact needs none.
    [Parameter(ParameterSetName = 'Install')]
    [string] $IndexUrl,

    # SHA-256 (hex) of the artifact or wheel -Package points at: nothing runs from a download that differs.
    [Parameter(ParameterSetName = 'Install')]
    [ValidatePattern('^[0-9A-Fa-f]{64}$')]
    [string] $PackageSha256,

    # MBRIDGE_SERVICEBUS_NAMESPACE, e.g. mybus.servicebus.windows.net (managed identity).
    [Parameter(ParameterSetName = 'Install')]
    [string] $ServiceBusNamespace,

    # MBRIDGE_PUBSUB_PROJECT.
    [Parameter(ParameterSetName = 'Install')]
    [string] $PubSubProject,

    # AZURE_CLIENT_ID: the client id of the VM's user-assigned managed identity.
    [Parameter(ParameterSetName = 'Install')]
    [string] $ClientId,

    # MBRIDGE_VERIFY_KEY: the Ed25519 public key commands must be signed with (one-line base64, or
    # a file the service can read). Required on every transport but jsonl: the agent does not
    # start without it.
    [Parameter(ParameterSetName = 'Install')]
    [string] $VerifyKey,

    # MBRIDGE_INSECURE_UNSIGNED_COMMANDS=true: run without -VerifyKey and execute unsigned commands,
    # so that anyone who can send to the bus could approve this VM's events. Never in production.
    [Parameter(ParameterSetName = 'Install')]
    [switch] $InsecureUnsignedCommands,

    # MBRIDGE_LISTEN: /healthz /readyz /metrics; 0.0.0.0:9797 for a load balancer probe.
    [Parameter(ParameterSetName = 'Install')]
    [string] $Listen = '127.0.0.1:9797',

    # MBRIDGE_VM_NAME; default: the name the metadata service reports.
    [Parameter(ParameterSetName = 'Install')]
    [string] $VmName,

    # Any other MBRIDGE_* setting, e.g. @{ MBRIDGE_LOG_LEVEL = 'DEBUG' }.
    [Parameter(ParameterSetName = 'Install')]
    [hashtable] $ExtraEnvironment = @{},

    [string] $InstallDir = "$env:ProgramFiles\mbridge",
    [string] $StateDir = "$env:ProgramData\mbridge",

    [Parameter(ParameterSetName = 'Install')]
    [string] $WinSWUrl = 'https://github.com/winsw/winsw/releases/download/v2.12.0/WinSW-x64.exe',

    # A WinSW-x64.exe already on the machine; used instead of downloading -WinSWUrl.
    [Parameter(ParameterSetName = 'Install')]
    [string] $WinSWPath,

    # SHA-256 (hex) of the WinSW executable. Mandatory, no default: supply the hash you verified.
    [Parameter(Mandatory = $true, ParameterSetName = 'Install')]
    [ValidatePattern('^[0-9A-Fa-f]{64}$')]
    [string] $WinSWSha256,

    # python.exe (3.9+) to build the virtualenv with; default: `py -3`, then python.exe on PATH.
    [Parameter(ParameterSetName = 'Install')]
    [string] $Python,

    [Parameter(ParameterSetName = 'Install')]
    [ValidateSet('Virtual', 'LocalSystem')]
    [string] $ServiceAccount = 'Virtual',

    # Rebuild the virtualenv (downloading the artifact again) even if -Package is already installed.
    [Parameter(ParameterSetName = 'Install')]
    [switch] $Force,

    # Skip `mbridge agent --check`.
    [Parameter(ParameterSetName = 'Install')]
    [switch] $SkipCheck,

    # Fail when the check reports a problem (default: warn and start the service anyway).
    [Parameter(ParameterSetName = 'Install')]
    [switch] $StrictCheck,

    [Parameter(Mandatory = $true, ParameterSetName = 'Uninstall')]
    [switch] $Uninstall,

    # With -Uninstall: also delete -StateDir (outbox, command ledger, logs).
    [Parameter(ParameterSetName = 'Uninstall')]
    [switch] $RemoveState
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'

$ServiceId = 'mbridge-agent'
$VirtualAccount = "NT SERVICE\$ServiceId"
$ServiceDir = Join-Path $InstallDir 'service'
$Wrapper = Join-Path $ServiceDir "$ServiceId.exe"
$WrapperXml = Join-Path $ServiceDir "$ServiceId.xml"
$Venv = Join-Path $InstallDir 'venv'
$Mbridge = Join-Path $Venv 'Scripts\mbridge.exe'
$SpecStamp = Join-Path $InstallDir '.installed-spec'
$LogDir = Join-Path $StateDir 'logs'

function Write-Step([string] $Text) { Write-Host "mbridge-install: $Text" }

# Runs a native program; throws with its exit code when it fails. Native programs write
# warnings to stderr, which Windows PowerShell 5.1 would turn into terminating errors under
# ErrorActionPreference=Stop, so the preference is relaxed for the call only.
function Invoke-Native([string] $What, [scriptblock] $Command) {
    $saved = $ErrorActionPreference
    $ErrorActionPreference = 'Continue'
    try {
        & $Command | ForEach-Object { Write-Host "  $_" }
        $code = $LASTEXITCODE
    } finally {
        $ErrorActionPreference = $saved
    }
    if ($code -ne 0) { throw "$What failed (exit code $code)" }
}

# Runs $Command with the process environment variables $Environment set (a $null value removes
# one), then puts back what was there.
function Invoke-WithEnvironment($Environment, [scriptblock] $Command) {
    $saved = @{}
    foreach ($key in $Environment.Keys) {
        $saved[$key] = [Environment]::GetEnvironmentVariable($key, 'Process')
        [Environment]::SetEnvironmentVariable($key, $Environment[$key], 'Process')
    }
    try {
        & $Command
    } finally {
        foreach ($key in $saved.Keys) { [Environment]::SetEnvironmentVariable($key, $saved[$key], 'Process') }
    }
}

function Remove-AgentService {
    $existing = Get-Service -Name $ServiceId -ErrorAction SilentlyContinue
    if ($null -eq $existing) { return }
    Write-Step "stopping and removing the existing service $ServiceId"
    if ($existing.Status -ne 'Stopped') {
        Stop-Service -Name $ServiceId -Force
        $existing.WaitForStatus('Stopped', [TimeSpan]::FromSeconds(60))
    }
    if (Test-Path $Wrapper) {
        Invoke-Native 'WinSW uninstall' { & $Wrapper uninstall }
    } else {
        Invoke-Native 'sc.exe delete' { & sc.exe delete $ServiceId }
    }
    # The SCM deletes a service only when the last handle to it closes (services.msc, a
    # monitoring agent): wait for it, or the install below fails with "marked for deletion".
    for ($i = 0; $i -lt 60 -and (Get-Service -Name $ServiceId -ErrorAction SilentlyContinue); $i++) {
        Start-Sleep -Seconds 1
    }
    if (Get-Service -Name $ServiceId -ErrorAction SilentlyContinue) {
        throw "the service $ServiceId is marked for deletion but still exists; close services.msc and run again"
    }
}

# python.exe >= 3.9 that the service account can run: the virtualenv's python.exe starts the
# base installation, so a per-user install (under C:\Users) is out of the service's reach.
function Find-Python {
    # Local to this function: a candidate that fails writes to stderr, which must not stop us.
    $ErrorActionPreference = 'Continue'
    $candidates = @()
    if ($Python) {
        $candidates += $Python
    } else {
        $launcher = Get-Command py.exe -ErrorAction SilentlyContinue
        if ($launcher) {
            $found = @(& $launcher.Source -3 -c 'import sys; print(sys.executable)' 2>$null)
            if ($LASTEXITCODE -eq 0 -and $found.Count -gt 0) { $candidates += ([string] $found[0]).Trim() }
        }
        $onPath = Get-Command python.exe -ErrorAction SilentlyContinue
        # The WindowsApps python.exe is the Store's install prompt, not an interpreter.
        if ($onPath -and $onPath.Source -notlike '*\WindowsApps\*') { $candidates += $onPath.Source }
    }
    foreach ($candidate in $candidates) {
        # @(): one line of output would otherwise be a string, and .Count fails under StrictMode.
        $info = @(& $candidate -c 'import sys, venv; print(sys.version_info >= (3, 9)); print(sys.base_prefix)' 2>$null)
        if ($LASTEXITCODE -ne 0 -or $info.Count -lt 2) { continue }
        if (([string] $info[0]).Trim() -ne 'True') {
            Write-Step "skipping $candidate`: older than Python 3.9"
            continue
        }
        $base = ([string] $info[1]).Trim()
        if ($ServiceAccount -eq 'Virtual' -and $base -like "$env:SystemDrive\Users\*") {
            throw "Python at $base is installed for one user only; the service account cannot run it. " +
                'Install Python for all users (the installer''s "Install for all users" option) or pass -Python.'
        }
        return $candidate
    }
    throw 'no Python 3.9 or newer found: install it for all users from python.org (with the py launcher), or pass -Python C:\path\to\python.exe'
}

function Get-WinSW([string] $Target) {
    $download = Join-Path ([IO.Path]::GetTempPath()) "WinSW-$([guid]::NewGuid().ToString('N')).exe"
    try {
        if ($WinSWPath) {
            Copy-Item -LiteralPath $WinSWPath -Destination $download
        } else {
            Write-Step "downloading WinSW from $WinSWUrl"
            # Windows PowerShell 5.1 may default to TLS 1.0, which GitHub refuses.
            [Net.ServicePointManager]::SecurityProtocol = [Net.ServicePointManager]::SecurityProtocol -bor [Net.SecurityProtocolType]::Tls12
            Invoke-WebRequest -Uri $WinSWUrl -OutFile $download -UseBasicParsing
        }
        $actual = (Get-FileHash -LiteralPath $download -Algorithm SHA256).Hash
        if ($actual -ne $WinSWSha256.ToUpperInvariant()) {
            throw "WinSW SHA-256 mismatch: expected $($WinSWSha256.ToUpperInvariant()), got $actual. Not installing it."
        }
        Copy-Item -LiteralPath $download -Destination $Target -Force
    } finally {
        Remove-Item -LiteralPath $download -Force -ErrorAction SilentlyContinue
    }
}

function Test-Venv {
    if (-not (Test-Path $Mbridge)) { return $false }
    $saved = $ErrorActionPreference
    $ErrorActionPreference = 'Continue'
    try { & $Mbridge --help *> $null; return ($LASTEXITCODE -eq 0) } finally { $ErrorActionPreference = $saved }
}

# What -Package installs, by the rules of install-agent.sh: Kind 'artifact', the agent's PEX file
# (Url, Sha256), whose hash this script checks before anything runs from it; or Kind 'pip', the
# requirement pip is given: maintenance-bridge[extras]==X.Y.Z, or maintenance-bridge[extras] @
# URL#sha256=HEX, whose fragment pip checks before it unpacks anything. Spec is what
# .installed-spec records. Anything else throws, saying what to pass.
function Resolve-AgentPackage {
    $agentExtras = @('agent-servicebus', 'agent-pubsub')
    $spec = $Package.Trim()
    $help = "pass -Package 'https://<host>/mbridge-agent-servicebus-X.Y.Z.pex#sha256=<hex of its .sha256 file>' " +
        '(the agent''s artifact, -pubsub on GCE; or its hash in -PackageSha256); with pip, ' +
        "-Package 'maintenance-bridge[agent-servicebus]==X.Y.Z' -IndexUrl https://<your index>/simple, or " +
        "-Package 'maintenance-bridge[agent-servicebus] @ https://<host>/maintenance_bridge-X.Y.Z-py3-none-any.whl' " +
        '-PackageSha256 <the wheel''s SHA-256> ([agent-pubsub] on GCE)'
    if ($spec -match '^[A-Za-z][A-Za-z0-9+.-]*://') {
        $name = 'maintenance-bridge'; $extras = ''; $rest = "@ $spec"
    } elseif ($spec -match '^([A-Za-z0-9._-]+)\s*(\[([^\]]*)\])?\s*(.*)$') {
        $name = $Matches[1].ToLowerInvariant() -replace '[_.]', '-'
        $extras = [string] $Matches[3]
        $rest = $Matches[4]
    } else {
        throw "-Package $spec is not a requirement this installer takes; $help"
    }
    if ($name -ne 'maintenance-bridge') { throw "-Package names '$name', not maintenance-bridge; $help" }
    # Only the agent's extras: [functions-azure] and [functions-gcp] bring the function apps' SDKs, which a VM never runs.
    $kept = @()
    foreach ($extra in ($extras -split ',')) {
        $extra = $extra.Trim().ToLowerInvariant() -replace '[_.]', '-'
        if (-not $extra) { continue }
        if ($agentExtras -notcontains $extra) {
            throw "-Package asks for the extra [$extra]; a VM takes only the agent's: $($agentExtras -join ', ')"
        }
        $kept += $extra
    }
    $extras = if ($kept.Count -gt 0) { "[$($kept -join ',')]" } else { '' }
    if ($rest.StartsWith('@')) {
        $url = $rest.Substring(1).Trim()
        $hash = ''
        if ($url.Contains('#')) {
            $fragment = $url.Substring($url.IndexOf('#') + 1)
            $url = $url.Substring(0, $url.IndexOf('#'))
            if ($fragment -cnotmatch '^sha256=([0-9A-Fa-f]{64})$') {
                throw "the URL in -Package ends in #$fragment; the only fragment taken is #sha256=<64 hex digits>"
            }
            $hash = $Matches[1]
        }
        # Case-sensitive (-cnotmatch), as bash's =~ in install-agent.sh: both take and refuse the same URLs.
        if ($url -cnotmatch '^(https|http|file)://\S+\.(whl|pex)$') {
            throw "-Package $spec is not an artifact or wheel URL (https://, http:// or file://, ending in .pex or .whl); $help"
        }
        if ($PackageSha256) {
            if ($hash -and $hash -ne $PackageSha256) { throw '-PackageSha256 and the #sha256= of -Package differ' }
            $hash = $PackageSha256
        }
        $hash = $hash.ToLowerInvariant()
        if ($url.EndsWith('.pex')) {
            if (-not $hash) {
                throw "the artifact URL in -Package has no SHA-256: anything served there would be run as an administrator; " +
                    "pass -Package '$url#sha256=<hex>' or -PackageSha256 <hex>: the hash in the .sha256 file make agent-artifact " +
                    'writes next to it (or Get-FileHash -Algorithm SHA256 of the file you built)'
            }
            # The artifact holds its bus's client: the extras of a requirement in front of it are not read.
            return [pscustomobject]@{ Kind = 'artifact'; Spec = "$url#sha256=$hash"; Url = $url; Sha256 = $hash }
        }
        if (-not $hash) { throw "the wheel URL in -Package has no SHA-256: anything served there would be installed; $help" }
        return [pscustomobject]@{ Kind = 'pip'; Spec = "maintenance-bridge$extras @ $url#sha256=$hash" }
    }
    if ($rest -match '^==\s*([0-9][0-9A-Za-z.+!-]*)$') {
        $version = $Matches[1]
        if ($PackageSha256) { throw '-PackageSha256 goes with a wheel URL; pip cannot check it against a version from an index' }
        if (-not $IndexUrl) { throw "-Package $spec needs the index that publishes it: -IndexUrl is not set; $help" }
        if ($IndexUrl -match '://(test\.)?pypi\.(org|python\.org)(/|$)') {
            throw '-IndexUrl is PyPI, where this project is not published: the name there may be anyone''s'
        }
        # pip takes a name from whichever index offers the version: with a second index, another
        # package of the same name and version could win.
        if ($env:PIP_EXTRA_INDEX_URL) {
            throw 'PIP_EXTRA_INDEX_URL is set: pip could take maintenance-bridge from either index (serve the dependencies through -IndexUrl)'
        }
        return [pscustomobject]@{ Kind = 'pip'; Spec = "maintenance-bridge$extras==$version" }
    }
    if (-not $rest) { throw "-Package $spec is not pinned: it installs whatever an index serves under that name; $help" }
    throw "-Package $spec is not pinned to one version (== X.Y.Z) or one wheel (@ URL); $help"
}

# True when the virtualenv holds $Spec (what the last install recorded) and its mbridge runs.
function Test-AgentInstalled([string] $Spec) {
    $installed = if (Test-Path $SpecStamp) { (Get-Content -LiteralPath $SpecStamp -Raw).Trim() } else { '' }
    return ($installed -eq $Spec -and (Test-Venv))
}

function Reset-Venv {
    if (Test-Path $Venv) { Remove-Item -LiteralPath $Venv -Recurse -Force }
    Remove-Item -LiteralPath $SpecStamp -Force -ErrorAction SilentlyContinue
}

# Records $Spec once the new virtualenv's mbridge runs: the next run with the same spec rebuilds nothing.
function Save-InstalledSpec([string] $Spec) {
    if (-not (Test-Venv)) { throw "$Spec installed, but $Mbridge does not run: is it the maintenance-bridge package?" }
    Set-Content -LiteralPath $SpecStamp -Value $Spec -Encoding UTF8
}

function Install-PipPackage([string] $PythonExe, [string] $Requirement) {
    Reset-Venv
    Write-Step "creating the virtualenv $Venv with $PythonExe"
    Invoke-Native 'python -m venv' { & $PythonExe -m venv $Venv }
    $venvPython = Join-Path $Venv 'Scripts\python.exe'
    $indexArguments = if ($IndexUrl) { @('--index-url', $IndexUrl) } else { @() }
    Invoke-Native 'pip upgrade' {
        & $venvPython -m pip install --quiet --disable-pip-version-check @indexArguments --upgrade 'pip>=21'
    }
    Write-Step "pip install $Requirement"
    Invoke-Native "pip install $Requirement" {
        & $venvPython -m pip install --quiet --disable-pip-version-check @indexArguments $Requirement
    }
    Save-InstalledSpec $Requirement
}

# pex unpacks every wheel of the artifact under PEX_ROOT, at paths of up to about 360 characters (the
# wheel's name twice and a 64-digit hash): past Windows' 260 unless long paths are enabled, which
# Python honours. Checked first, so that a machine without them is told before anything changes.
function Assert-LongPaths {
    $fileSystem = 'HKEY_LOCAL_MACHINE\SYSTEM\CurrentControlSet\Control\FileSystem'
    $enabled = [Microsoft.Win32.Registry]::GetValue($fileSystem, 'LongPathsEnabled', 0)
    if ($enabled -ne 1) {
        throw 'the artifact needs Windows long paths (pex unpacks it into paths longer than 260 characters): run ' +
            'Set-ItemProperty HKLM:\SYSTEM\CurrentControlSet\Control\FileSystem -Name LongPathsEnabled -Value 1 ' +
            '(or enable the policy "Enable Win32 long paths"), then this script again; nothing was changed'
    }
}

# Downloads the artifact to $Directory\agent.pex and returns that path once its SHA-256 is the one
# -Package names; a file that differs is refused before anything runs from it.
function Get-AgentArtifact($Artifact, [string] $Directory) {
    New-Item -ItemType Directory -Force -Path $Directory | Out-Null
    $target = Join-Path $Directory 'agent.pex'
    Write-Step "fetching $($Artifact.Url)"
    if ($Artifact.Url.StartsWith('file://')) {
        Copy-Item -LiteralPath ([Uri] $Artifact.Url).LocalPath -Destination $target
    } else {
        [Net.ServicePointManager]::SecurityProtocol = [Net.ServicePointManager]::SecurityProtocol -bor [Net.SecurityProtocolType]::Tls12
        # Windows PowerShell 5.1 redraws its progress bar for every chunk, which slows a download of
        # tens of MiB to minutes.
        $ProgressPreference = 'SilentlyContinue'
        # Five attempts, as install-agent.sh's curl --retry 5: a first boot often races the network.
        for ($attempt = 1; ; $attempt++) {
            try {
                Invoke-WebRequest -Uri $Artifact.Url -OutFile $target -UseBasicParsing
                break
            } catch {
                if ($attempt -ge 5) { throw "cannot fetch $($Artifact.Url) after $attempt attempts: $_" }
                Write-Step "fetching $($Artifact.Url) failed ($_); again in $(2 * $attempt) s"
                Start-Sleep -Seconds (2 * $attempt)
            }
        }
    }
    $actual = (Get-FileHash -LiteralPath $target -Algorithm SHA256).Hash.ToLowerInvariant()
    if ($actual -ne $Artifact.Sha256) {
        throw "the artifact at $($Artifact.Url) has SHA-256 $actual, not the $($Artifact.Sha256) that -Package names; " +
            'refusing to run it, nothing was changed: a rebuilt artifact needs its new hash in -Package (make agent-artifact writes <file>.sha256)'
    }
    return $target
}

# The artifact's virtualenv, made by pex's own tool as install-agent.sh makes it (the same flags),
# from the wheels inside the file for this Python on Windows: no index, no pip. Its scratch space
# (PEX_ROOT) is $PexRoot; the PEX_* variables that would make the file pick another interpreter or
# run something else are cleared.
function Install-AgentArtifact([string] $PythonExe, [string] $PexFile, [string] $Spec, [string] $PexRoot) {
    Reset-Venv
    Write-Step "creating the virtualenv $Venv with $PythonExe from the artifact"
    $pexEnvironment = @{
        PEX_TOOLS = '1'; PEX_ROOT = $PexRoot
        PEX_PYTHON = $null; PEX_PYTHON_PATH = $null; PEX_INHERIT_PATH = $null; PEX_SCRIPT = $null; PEX_MODULE = $null
    }
    Invoke-WithEnvironment $pexEnvironment {
        Invoke-Native 'pex venv' { & $PythonExe $PexFile venv --compile $Venv }
    }
    Save-InstalledSpec $Spec
}

function Get-AgentEnvironment {
    $environment = [ordered]@{
        MBRIDGE_CLOUD     = $Cloud
        MBRIDGE_TRANSPORT = $Transport
        # The agent's default for a service account would be under a user profile.
        MBRIDGE_STATE_DIR = $StateDir
        MBRIDGE_LISTEN    = $Listen
        # UTF-8 log lines whatever the system code page (VM names, descriptions).
        PYTHONUTF8        = '1'
    }
    if ($ServiceBusNamespace) { $environment['MBRIDGE_SERVICEBUS_NAMESPACE'] = $ServiceBusNamespace }
    if ($PubSubProject) { $environment['MBRIDGE_PUBSUB_PROJECT'] = $PubSubProject }
    if ($ClientId) { $environment['AZURE_CLIENT_ID'] = $ClientId }
    if ($VerifyKey) { $environment['MBRIDGE_VERIFY_KEY'] = $VerifyKey }
    if ($InsecureUnsignedCommands) { $environment['MBRIDGE_INSECURE_UNSIGNED_COMMANDS'] = 'true' }
    if ($VmName) { $environment['MBRIDGE_VM_NAME'] = $VmName }
    foreach ($key in $ExtraEnvironment.Keys) { $environment[[string] $key] = [string] $ExtraEnvironment[$key] }
    return $environment
}

function Write-WinSWConfig($Environment) {
    $esc = { param([string] $s) [Security.SecurityElement]::Escape($s) }
    $envLines = foreach ($key in $Environment.Keys) {
        "  <env name=`"$(& $esc $key)`" value=`"$(& $esc $Environment[$key])`" />"
    }
    $envBlock = $envLines -join "`r`n"
    $xml = @"
<!-- Written by install-agent.ps1; run it again instead of editing this file. -->
<service>
  <id>$ServiceId</id>
  <name>maintenance-bridge agent</name>
  <description>Forwards this VM's cloud maintenance notices to the bus and carries approvals back.</description>
  <executable>$(& $esc $Mbridge)</executable>
  <arguments>agent</arguments>
  <workingdirectory>$(& $esc $StateDir)</workingdirectory>
  <startmode>Automatic</startmode>
$envBlock
  <!-- Stop: Ctrl+C, then the agent flushes its outbox for up to 10 s. -->
  <stoptimeout>20 sec</stoptimeout>
  <!-- Never give up: a VM without its agent silently misses maintenance notices. The last
       entry repeats for every later failure; the count resets after an hour of running. -->
  <onfailure action="restart" delay="2 sec" />
  <onfailure action="restart" delay="10 sec" />
  <onfailure action="restart" delay="30 sec" />
  <resetfailure>1 hour</resetfailure>
  <logpath>$(& $esc $LogDir)</logpath>
  <log mode="roll-by-size">
    <sizeThreshold>10240</sizeThreshold>
    <keepFiles>8</keepFiles>
  </log>
</service>
"@
    [IO.File]::WriteAllText($WrapperXml, $xml, (New-Object Text.UTF8Encoding $false))
}

# Replaces the ACL of $Path: SYSTEM and Administrators full control, the service account
# $ServiceRights, inherited by everything below; nobody else.
function Set-PrivateAcl([string] $Path, [string] $ServiceRights) {
    $grants = @('*S-1-5-18:(OI)(CI)F', '*S-1-5-32-544:(OI)(CI)F')
    if ($ServiceAccount -eq 'Virtual') { $grants += "${VirtualAccount}:(OI)(CI)$ServiceRights" }
    Invoke-Native "icacls $Path /reset" { & icacls.exe $Path /reset /T /C /Q }
    Invoke-Native "icacls $Path" { & icacls.exe $Path /inheritance:r /grant:r @grants /Q }
}

function Invoke-AgentCheck($Environment) {
    Write-Step "running 'mbridge agent --check' (Azure's first metadata call may take up to 2 minutes)"
    $savedPreference = $ErrorActionPreference
    $ErrorActionPreference = 'Continue'
    try {
        Invoke-WithEnvironment $Environment { & $Mbridge agent --check 2>&1 | ForEach-Object { Write-Host "  | $_" } }
        $code = $LASTEXITCODE
    } finally {
        $ErrorActionPreference = $savedPreference
    }
    if ($code -eq 0) { Write-Step 'check: healthy'; return }
    if ($code -eq 2) { throw 'the settings have a configuration error (above); fix the parameters and run again' }
    # At first boot the usual causes are transient (a role assignment not propagated yet); the
    # agent retries them on its own, so a VM with a retrying agent beats one without.
    if ($StrictCheck) { throw '-StrictCheck: the check found problem(s) (above); not starting the service' }
    Write-Warning "the check found problem(s) (above); starting the service anyway: it keeps retrying. Logs: $LogDir"
}

if ($PSCmdlet.ParameterSetName -eq 'Uninstall') {
    Remove-AgentService
    if (Test-Path $InstallDir) { Remove-Item -LiteralPath $InstallDir -Recurse -Force }
    if ($RemoveState -and (Test-Path $StateDir)) {
        Remove-Item -LiteralPath $StateDir -Recurse -Force
    } elseif (Test-Path $StateDir) {
        Write-Step "kept $StateDir (the outbox may hold unpublished events); -RemoveState deletes it"
    }
    Write-Step 'uninstalled'
    return
}

if (-not $Transport) { $Transport = if ($Cloud -eq 'azure') { 'servicebus' } else { 'pubsub' } }
if ($Transport -eq 'servicebus' -and -not $ServiceBusNamespace -and
    -not $ExtraEnvironment.ContainsKey('MBRIDGE_SERVICEBUS_CONNECTION_STRING')) {
    throw '-Transport servicebus needs -ServiceBusNamespace (e.g. mybus.servicebus.windows.net)'
}
if ($Transport -eq 'pubsub' -and -not $PubSubProject) { throw '-Transport pubsub needs -PubSubProject' }
if ($ClientId -and $Cloud -ne 'azure') { throw '-ClientId (a managed identity) is for -Cloud azure only' }
if ($Transport -ne 'jsonl' -and -not $VerifyKey -and -not $InsecureUnsignedCommands -and
    -not $ExtraEnvironment.ContainsKey('MBRIDGE_VERIFY_KEY')) {
    throw "-Transport $Transport needs -VerifyKey: the functions' public key, which the agent checks every command's signature with (or -InsecureUnsignedCommands, knowingly)"
}

# Not $package: PowerShell names are case-insensitive, and $Package is the [string] parameter.
$agentPackage = Resolve-AgentPackage
$pythonExe = Find-Python
$rebuild = $Force -or -not (Test-AgentInstalled $agentPackage.Spec)
New-Item -ItemType Directory -Force -Path $InstallDir, $ServiceDir, $StateDir, $LogDir | Out-Null
# In the install directory (by default under Program Files: administrators only), so that nobody
# else can replace the file between its check and its run.
$download = Join-Path $InstallDir ".download-$PID"
try {
    $pexFile = $null
    if ($rebuild -and $agentPackage.Kind -eq 'artifact') {
        Assert-LongPaths
        # Fetched and checked while the agent still runs: a file with another hash changes nothing.
        $pexFile = Get-AgentArtifact $agentPackage $download
    }
    Remove-AgentService # the agent's files are locked while it runs, and WinSW reads its XML at install
    if (-not $rebuild) {
        Write-Step "$($agentPackage.Spec) is already installed; not rebuilding the virtualenv (-Force rebuilds it)"
    } elseif ($pexFile) {
        Install-AgentArtifact $pythonExe $pexFile $agentPackage.Spec (Join-Path $download 'pex-root')
    } else {
        Install-PipPackage $pythonExe $agentPackage.Spec
    }
} finally {
    Remove-Item -LiteralPath $download -Recurse -Force -ErrorAction SilentlyContinue
}
Get-WinSW $Wrapper
$environment = Get-AgentEnvironment
Write-WinSWConfig $environment

Write-Step "installing the service $ServiceId"
Invoke-Native 'WinSW install' { & $Wrapper install }
if ($ServiceAccount -eq 'Virtual') {
    # WinSW installs as LocalSystem; the virtual account is set with the SCM's own tool, which
    # needs no password for it. Its SID exists from here on, so the ACLs below can name it.
    Invoke-Native 'sc.exe sidtype' { & sc.exe sidtype $ServiceId unrestricted }
    Invoke-Native 'sc.exe config obj=' { & sc.exe config $ServiceId obj= $VirtualAccount }
}
# The XML may hold a connection string: the service reads it, nobody else but admins.
Set-PrivateAcl $ServiceDir 'RX'
Set-PrivateAcl $StateDir 'M'

if (-not $SkipCheck) { Invoke-AgentCheck $environment }

Write-Step "starting $ServiceId"
Start-Service -Name $ServiceId
Start-Sleep -Seconds 5
$status = (Get-Service -Name $ServiceId).Status
if ($status -ne 'Running') {
    throw "$ServiceId is $status after starting; see $LogDir\$ServiceId.err.log and $LogDir\$ServiceId.wrapper.log"
}
Write-Step "$ServiceId is running as $(if ($ServiceAccount -eq 'Virtual') { $VirtualAccount } else { 'LocalSystem' }). Check: Invoke-WebRequest -UseBasicParsing http://127.0.0.1:9797/healthz"
