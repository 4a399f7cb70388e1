#!/usr/bin/env bash
# Install or update the maintenance-bridge agent on a Linux VM with systemd.
#
# Idempotent: run it at first boot (cloud-init, GCE startup script), at every boot, or by hand
# for an upgrade. It only rebuilds the Python environment when the requested package changed,
# and only restarts the agent when the package, the unit or agent.env changed.
set -eu
set -o pipefail
umask 022 # the code under /opt/mbridge is world-readable; secrets are chmod'ed one by one

usage() {
  cat <<'EOF'
Usage: install-agent.sh [--unit FILE] [--package SPEC] [--force] [--no-check] [--strict-check]
       install-agent.sh --uninstall [--purge]

Installs the maintenance-bridge agent as the systemd service mbridge-agent:
  1. reads /etc/mbridge/install.env, which must name one exact package: the agent's artifact
     (make agent-artifact: one file with the agent and its locked dependencies) and its SHA-256,
       MBRIDGE_PACKAGE=https://host/mbridge-agent-servicebus-0.1.0.pex#sha256=<64 hex digits>
     (or MBRIDGE_PACKAGE_SHA256=<hex> on a line of its own), which this script checks before
     running anything from it and which needs nothing else from the network; or, for pip,
       MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus]==0.1.0     (or [agent-pubsub])
       PIP_INDEX_URL=https://pypi.example.internal/simple         (the index that serves it)
     or a wheel and its SHA-256, which pip checks:
       MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus] @ https://host/maintenance_bridge-0.1.0-py3-none-any.whl
       MBRIDGE_PACKAGE_SHA256=<64 hex digits>                     (or #sha256=<hex> after the URL)
     and refuses anything else (PIP_* lines there are passed to pip);
  2. finds python3 >= 3.9 with venv, installing it with apt-get, dnf, yum or zypper if missing
     (the artifact needs only the venv module; pip needs ensurepip too);
  3. creates the system user mbridge (no login shell, no home);
  4. builds a virtualenv under /opt/mbridge from the artifact (or with pip), unless the same
     spec is already installed and working;
  5. installs the unit (--unit FILE, else /etc/systemd/system/mbridge-agent.service as
     written by cloud-init, else mbridge-agent.service next to this script);
  6. makes /etc/mbridge/agent.env root:mbridge 0640 and runs `mbridge agent --check` as
     the mbridge user (a configuration error stops the install: on a bus, agent.env needs
     MBRIDGE_VERIFY_KEY, the functions' public key, or MBRIDGE_INSECURE_UNSIGNED_COMMANDS=true);
  7. enables and starts the service, restarting it when something changed.

Options:
  --unit FILE       the systemd unit to install
  --package SPEC    install SPEC instead of install.env's MBRIDGE_PACKAGE (an artifact or wheel
                    URL then carries its hash as #sha256=<hex>; MBRIDGE_PACKAGE_SHA256 is not read)
  --force           rebuild the virtualenv even if the same spec is installed
  --no-check        skip `mbridge agent --check`
  --strict-check    fail when the check reports a problem (default: warn and start anyway)
  --uninstall       stop and remove the service and /opt/mbridge
  --purge           with --uninstall: also remove /etc/mbridge, /var/lib/mbridge,
                    /var/log/mbridge and the mbridge user
  -h, --help        this text

Exit status: 0 installed and running; 1 failed (the message says why); 64 usage error.
EOF
}

log() { printf 'mbridge-install: %s\n' "$*" >&2; }
warn() { printf 'mbridge-install: WARNING: %s\n' "$*" >&2; }
die() {
  printf 'mbridge-install: ERROR: %s\n' "$*" >&2
  exit 1
}

# Every path hangs off MBRIDGE_INSTALL_ROOT (empty on a VM), so that the tests can run the whole
# script in a scratch directory with stand-ins for systemctl, useradd, chown and runuser on PATH.
ROOT="${MBRIDGE_INSTALL_ROOT:-}"
ETC_DIR="$ROOT/etc/mbridge"
INSTALL_ENV="$ETC_DIR/install.env"
AGENT_ENV="$ETC_DIR/agent.env"
PREFIX="$ROOT/opt/mbridge"
STATE_DIR="$ROOT/var/lib/mbridge"
LOG_DIR="$ROOT/var/log/mbridge"
UNIT_NAME="mbridge-agent.service"
UNIT_PATH="$ROOT/etc/systemd/system/$UNIT_NAME"
SERVICE_USER="mbridge"
SYSTEMCTL="${SYSTEMCTL:-systemctl}"
# Seconds to watch the service after (re)starting it, to catch an immediate crash loop.
SETTLE_SECONDS="${MBRIDGE_INSTALL_SETTLE_SECONDS:-5}"

UNIT_ARG=""
PACKAGE_ARG=""
FORCE=0
CHECK=1
STRICT_CHECK=0
UNINSTALL=0
PURGE=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    --unit)
      [ "$#" -ge 2 ] || { usage >&2; exit 64; }
      UNIT_ARG="$2"
      shift 2
      ;;
    --package)
      [ "$#" -ge 2 ] || { usage >&2; exit 64; }
      PACKAGE_ARG="$2"
      shift 2
      ;;
    --force) FORCE=1; shift ;;
    --no-check) CHECK=0; shift ;;
    --strict-check) STRICT_CHECK=1; shift ;;
    --uninstall) UNINSTALL=1; shift ;;
    --purge) PURGE=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *)
      printf 'mbridge-install: unknown argument: %s\n\n' "$1" >&2
      usage >&2
      exit 64
      ;;
  esac
done
[ "$PURGE" = 0 ] || [ "$UNINSTALL" = 1 ] || { log "--purge goes with --uninstall"; exit 64; }

# KEY=value lines of an environment file, read the way systemd's EnvironmentFile= reads them:
# blank lines and lines starting with # or ; are skipped, spaces around key and value are
# dropped, one pair of surrounding quotes is removed. Nothing is evaluated by a shell.
env_assignments() {
  local line key value
  while IFS= read -r line || [ -n "$line" ]; do
    line="${line%$'\r'}"
    line="${line#"${line%%[![:space:]]*}"}"
    case "$line" in '' | '#'* | ';'*) continue ;; esac
    if [[ "$line" != *=* ]]; then
      warn "$1: ignoring a line without '=': ${line%%[[:space:]]*}..."
      continue
    fi
    key="${line%%=*}"
    key="${key%"${key##*[![:space:]]}"}"
    value="${line#*=}"
    value="${value#"${value%%[![:space:]]*}"}"
    value="${value%"${value##*[![:space:]]}"}"
    if [[ ! "$key" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      warn "$1: ignoring an invalid variable name: $key"
      continue
    fi
    if [ "${#value}" -ge 2 ]; then
      case "$value" in
        \"*\" | \'*\') value="${value:1:${#value}-2}" ;;
      esac
    fi
    printf '%s=%s\n' "$key" "$value"
  done <"$1"
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# True when the stamp file $1 does not hold $2 (absent or different).
stamp_changed() {
  local stamp="$1" value="$2"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$value" ]; then
    return 1
  fi
  return 0
}

# ---------------------------------------------------------------- what pip may install

# The spec must name one artifact: a pinned version from an index install.env names, or a wheel
# URL with its SHA-256. A bare name or a range installs whatever an index serves under that name
# on the day of the boot, and the public index holds no package of this project: the first boot
# would fail, or install someone else's package of the same name, as root. The hash is checked by
# pip itself (the #sha256= fragment of a direct reference), before anything is unpacked.
AGENT_EXTRAS="agent-servicebus agent-pubsub"

refuse_package() {
  printf 'mbridge-install: ERROR: %s\n' "$1" >&2
  cat >&2 <<EOF
mbridge-install: set one exact package in $INSTALL_ENV: the agent's artifact and its SHA-256, which this script checks:
mbridge-install:     MBRIDGE_PACKAGE=https://<host>/mbridge-agent-servicebus-X.Y.Z.pex#sha256=<sha256sum of the file>   (-pubsub on GCE)
mbridge-install: or a pinned version and its index:
mbridge-install:     MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus]==X.Y.Z    ([agent-pubsub] on GCE)
mbridge-install:     PIP_INDEX_URL=https://<your index>/simple
mbridge-install: or a wheel URL and its SHA-256, which pip checks:
mbridge-install:     MBRIDGE_PACKAGE=maintenance-bridge[agent-servicebus] @ https://<host>/maintenance_bridge-X.Y.Z-py3-none-any.whl
mbridge-install:     MBRIDGE_PACKAGE_SHA256=<sha256sum of the wheel>      (or #sha256=<hex> at the end of the URL)
EOF
  exit 1
}

# Sets INSTALL_SPEC to what is installed: `URL.pex#sha256=HEX` (the artifact; INSTALL_KIND=artifact,
# ARTIFACT_URL and ARTIFACT_SHA256 set), or what pip installs (INSTALL_KIND=pip):
# `maintenance-bridge[extras]==X.Y.Z` or `maintenance-bridge[extras] @ URL#sha256=HEX`.
# $1 is the spec, $2 MBRIDGE_PACKAGE_SHA256.
INSTALL_KIND=pip
ARTIFACT_URL=""
ARTIFACT_SHA256=""
resolve_package() {
  local spec="$1" sha256="$2" name="maintenance-bridge" extras="" rest="" url fragment="" extra kept=""
  if [[ "$spec" =~ ^[A-Za-z][A-Za-z0-9+.-]*:// ]]; then
    rest="@ $spec"
  elif [[ "$spec" =~ ^([A-Za-z0-9._-]+)[[:space:]]*(\[([^]]*)\])?[[:space:]]*(.*)$ ]]; then
    name="${BASH_REMATCH[1],,}"
    name="${name//[_.]/-}"
    extras="${BASH_REMATCH[3]}"
    rest="${BASH_REMATCH[4]}"
  else
    refuse_package "MBRIDGE_PACKAGE=$spec is not a requirement this installer takes"
  fi
  [ "$name" = maintenance-bridge ] || refuse_package "MBRIDGE_PACKAGE names '$name', not maintenance-bridge"
  # Only the agent's extras: [functions-azure] and [functions-gcp] bring the function apps' SDKs, which a VM never runs.
  for extra in ${extras//,/ }; do
    extra="${extra,,}"
    extra="${extra//[_.]/-}"
    case " $AGENT_EXTRAS " in
      *" $extra "*) kept="${kept:+$kept,}$extra" ;;
      *) refuse_package "MBRIDGE_PACKAGE asks for the extra [$extra]; a VM takes only the agent's: ${AGENT_EXTRAS// /, }" ;;
    esac
  done
  extras="${kept:+[$kept]}"
  case "$rest" in
    @*)
      url="${rest#@}"
      url="${url#"${url%%[![:space:]]*}"}"
      if [[ "$url" == *'#'* ]]; then
        fragment="${url#*#}"
        url="${url%%#*}"
        [[ "$fragment" =~ ^sha256=[0-9A-Fa-f]{64}$ ]] ||
          refuse_package "the URL in MBRIDGE_PACKAGE ends in #$fragment; the only fragment taken is #sha256=<64 hex digits>"
        fragment="${fragment#sha256=}"
      fi
      [[ "$url" =~ ^(https|http|file)://[^[:space:]]+\.(whl|pex)$ ]] ||
        refuse_package "MBRIDGE_PACKAGE=$spec is not an artifact or wheel URL (https://, http:// or file://, ending in .pex or .whl)"
      if [ -n "$sha256" ]; then
        [[ "$sha256" =~ ^[0-9A-Fa-f]{64}$ ]] || refuse_package "MBRIDGE_PACKAGE_SHA256 is not 64 hex digits"
        [ -z "$fragment" ] || [ "${fragment,,}" = "${sha256,,}" ] ||
          refuse_package "MBRIDGE_PACKAGE_SHA256 and the #sha256= of MBRIDGE_PACKAGE differ"
        fragment="$sha256"
      fi
      if [[ "$url" == *.pex ]]; then
        [ -n "$fragment" ] ||
          refuse_package "the artifact URL in MBRIDGE_PACKAGE has no SHA-256: anything served at that URL would be run as root"
        # The artifact holds its bus's client: the extras of a requirement in front of it are not read.
        INSTALL_KIND=artifact
        ARTIFACT_URL="$url"
        ARTIFACT_SHA256="${fragment,,}"
        INSTALL_SPEC="$url#sha256=$ARTIFACT_SHA256"
        return 0
      fi
      [ -n "$fragment" ] ||
        refuse_package "the wheel URL in MBRIDGE_PACKAGE has no SHA-256: anything served at that URL would be installed"
      INSTALL_SPEC="maintenance-bridge$extras @ $url#sha256=${fragment,,}"
      ;;
    ==*)
      rest="${rest#==}"
      rest="${rest#"${rest%%[![:space:]]*}"}"
      # One version: no wildcard (==1.*), no environment marker.
      [[ "$rest" =~ ^[0-9][0-9A-Za-z.+!-]*$ ]] ||
        refuse_package "MBRIDGE_PACKAGE=$spec does not pin one version (maintenance-bridge[...]==X.Y.Z)"
      [ -z "$sha256" ] ||
        refuse_package "MBRIDGE_PACKAGE_SHA256 goes with a wheel URL; pip cannot check it against a version from an index"
      [ -n "${PIP_INDEX_URL:-}" ] ||
        refuse_package "MBRIDGE_PACKAGE=$spec needs the index that publishes it: PIP_INDEX_URL is not set"
      case "${PIP_INDEX_URL,,}" in
        *://pypi.org | *://pypi.org/* | *://pypi.python.org/* | *://test.pypi.org/*)
          refuse_package "PIP_INDEX_URL is PyPI, where this project is not published: the name there may be anyone's" ;;
      esac
      # pip takes a name from whichever index offers the version: with a second index, another
      # package of the same name and version could win.
      [ -z "${PIP_EXTRA_INDEX_URL:-}" ] ||
        refuse_package "PIP_EXTRA_INDEX_URL is set: pip could take maintenance-bridge from either index (serve the dependencies through PIP_INDEX_URL)"
      INSTALL_SPEC="maintenance-bridge$extras==$rest"
      ;;
    '') refuse_package "MBRIDGE_PACKAGE=$spec is not pinned: it installs whatever an index serves under that name" ;;
    *) refuse_package "MBRIDGE_PACKAGE=$spec is not pinned to one version (== X.Y.Z) or one wheel (@ URL)" ;;
  esac
}

# ---------------------------------------------------------------- uninstall

uninstall() {
  log "stopping and removing $UNIT_NAME"
  "$SYSTEMCTL" disable --now "$UNIT_NAME" >/dev/null 2>&1 || true
  rm -f "$UNIT_PATH"
  "$SYSTEMCTL" daemon-reload || warn "systemctl daemon-reload failed"
  rm -rf "$PREFIX"
  if [ "$PURGE" = 1 ]; then
    log "purging configuration, state, logs and the $SERVICE_USER user"
    rm -rf "$ETC_DIR" "$STATE_DIR" "$LOG_DIR" "$UNIT_PATH.d"
    if getent passwd "$SERVICE_USER" >/dev/null; then userdel "$SERVICE_USER" || warn "userdel failed"; fi
    if getent group "$SERVICE_USER" >/dev/null; then groupdel "$SERVICE_USER" || true; fi
  else
    log "kept $ETC_DIR and $STATE_DIR (the outbox may hold unpublished events); --purge removes them"
  fi
  log "uninstalled"
}

# ---------------------------------------------------------------- python

# The artifact's virtualenv is made without pip (`python3 -m venv --without-pip`, then filled from
# the file): the venv module is enough, and Debian's and Ubuntu's python3 has it without
# python3-venv. pip needs ensurepip as well.
python_ok() {
  local modules="sys, venv"
  [ "$INSTALL_KIND" = artifact ] || modules="sys, venv, ensurepip"
  "$1" -c "import $modules; sys.exit(0 if sys.version_info >= (3, 9) else 1)" >/dev/null 2>&1
}

# Sets PYTHON to the first interpreter >= 3.9 that can build a venv with pip.
find_python() {
  local candidate
  for candidate in ${MBRIDGE_PYTHON:-} python3 python3.13 python3.12 python3.11 python3.10 python3.9; do
    if command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate"; then
      PYTHON="$(command -v "$candidate")"
      return 0
    fi
  done
  return 1
}

# The distribution's python3 first; then a newer one side by side where the default is too old
# (Ubuntu 20.04: 3.8, RHEL 8 and SLES 15: 3.6). Debian and Ubuntu ship venv's pip separately.
install_python() {
  local packages
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    # First boot often runs unattended-upgrades at the same time: wait for the dpkg lock.
    apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null || warn "apt-get update failed"
    for packages in "python3 python3-venv" "python3.12 python3.12-venv" "python3.11 python3.11-venv" \
      "python3.10 python3.10-venv" "python3.9 python3.9-venv"; do
      # shellcheck disable=SC2086 # one word per package
      apt-get -o DPkg::Lock::Timeout=300 install -y -q $packages >/dev/null 2>&1 && find_python && return 0
    done
  elif command -v dnf >/dev/null 2>&1 || command -v yum >/dev/null 2>&1; then
    local manager
    manager="$(command -v dnf || command -v yum)"
    for packages in python3 python3.12 python3.11 python39; do
      "$manager" install -y -q "$packages" >/dev/null 2>&1 && find_python && return 0
    done
  elif command -v zypper >/dev/null 2>&1; then
    for packages in python3 python312 python311 python39; do
      zypper --non-interactive install "$packages" >/dev/null 2>&1 && find_python && return 0
    done
  fi
  return 1
}

# ---------------------------------------------------------------- the package

venv_works() {
  [ -x "$PREFIX/bin/mbridge" ] && "$PREFIX/bin/mbridge" --help >/dev/null 2>&1
}

# Downloads the artifact to $1 and checks its SHA-256 before anything runs from it.
fetch_artifact() {
  local target="$1" actual
  case "$ARTIFACT_URL" in
    file://*) cp "${ARTIFACT_URL#file://}" "$target" || return 1 ;;
    *)
      if command -v curl >/dev/null 2>&1; then
        curl -fsSL --retry 5 --retry-delay 2 --connect-timeout 20 --max-time 900 -o "$target" "$ARTIFACT_URL" || return 1
      else
        "$PYTHON" -c 'import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=120) as response, open(sys.argv[2], "wb") as out:
    shutil.copyfileobj(response, out)' "$ARTIFACT_URL" "$target" || return 1
      fi
      ;;
  esac
  actual="$(sha256_of "$target")"
  if [ "$actual" != "$ARTIFACT_SHA256" ]; then
    log "ERROR: the artifact at $ARTIFACT_URL has SHA-256 $actual, not the $ARTIFACT_SHA256 that MBRIDGE_PACKAGE names"
    log "ERROR: refusing to run it: a rebuilt artifact needs its new hash in MBRIDGE_PACKAGE (make agent-artifact writes <file>.sha256)"
    return 2
  fi
}

# The artifact's virtualenv: pex's own tool turns the file into one (`PEX_TOOLS=1 python3 x.pex venv
# DIR`), from the wheels inside it for this Python and platform, with no index and no pip. Its
# scratch space (PEX_ROOT) is a directory of this install, removed afterwards.
install_artifact() {
  local venv="$1" work="$PREFIX/.download-$$" rc=0
  rm -rf "$work"
  mkdir -p "$work"
  log "downloading $ARTIFACT_URL"
  fetch_artifact "$work/agent.pex" || rc=$?
  if [ "$rc" = 0 ]; then
    log "creating a virtualenv with $PYTHON ($("$PYTHON" -c 'import platform; print(platform.python_version())')) from the artifact"
    env -u PEX_PYTHON -u PEX_PYTHON_PATH -u PEX_INHERIT_PATH -u PEX_SCRIPT -u PEX_MODULE PEX_ROOT="$work/pex-root" \
      PEX_TOOLS=1 "$PYTHON" "$work/agent.pex" venv --compile "$venv" >&2 || rc=1
  fi
  rm -rf "$work"
  return "$rc"
}

# A new virtualenv per install, switched to with one rename of the `current` link: a failed
# upgrade leaves the running version in place, and /opt/mbridge/bin never points at half an
# install. /opt/mbridge/bin -> current/bin is what the unit's ExecStart= names.
install_package() {
  local spec="$1" id venv pip_major rc=0
  id="$(date -u +%Y%m%dT%H%M%S)-$$"
  venv="$PREFIX/venvs/$id"
  mkdir -p "$PREFIX/venvs"
  if [ -e "$PREFIX/bin" ] && [ ! -L "$PREFIX/bin" ]; then
    die "$PREFIX/bin is a directory this installer did not make; move $PREFIX aside and run again"
  fi
  if [ "$INSTALL_KIND" = artifact ]; then
    install_artifact "$venv" || rc=$?
    if [ "$rc" != 0 ]; then
      rm -rf "$venv"
      [ "$rc" = 2 ] || die "cannot install $spec (output above); the previous installation, if any, is unchanged"
      die "the artifact's SHA-256 differs: nothing was run from it; the previous installation, if any, is unchanged"
    fi
    activate_venv "$spec" "$id" "$venv"
    return 0
  fi
  log "creating a virtualenv with $PYTHON ($("$PYTHON" -c 'import platform; print(platform.python_version())'))"
  "$PYTHON" -m venv "$venv" || { rm -rf "$venv"; die "$PYTHON -m venv failed"; }
  # pip before 21 cannot read the manylinux_2_28 wheels of cryptography and grpcio.
  pip_major="$("$venv/bin/python" -c 'import pip; print(pip.__version__.split(".")[0])')"
  if [ "$pip_major" -lt 21 ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade 'pip>=21' ||
      { rm -rf "$venv"; die "cannot upgrade pip in the virtualenv (is the package index reachable?)"; }
  fi
  log "pip install $spec"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"; then
    rm -rf "$venv"
    die "pip install $spec failed (output above); the previous installation, if any, is unchanged"
  fi
  activate_venv "$spec" "$id" "$venv"
}

# Makes the virtualenv $3 (id $2, holding $1) the current one, once its mbridge works.
activate_venv() {
  local spec="$1" id="$2" venv="$3" previous
  if ! "$venv/bin/mbridge" --help >/dev/null 2>&1; then
    rm -rf "$venv"
    die "$spec installed, but it has no working 'mbridge' command: is it the maintenance-bridge package?"
  fi
  previous="$(basename "$(readlink "$PREFIX/current" 2>/dev/null || echo none)")"
  ln -sfn "venvs/$id" "$PREFIX/.current.new"
  mv -Tf "$PREFIX/.current.new" "$PREFIX/current"
  [ -L "$PREFIX/bin" ] || ln -s current/bin "$PREFIX/bin"
  printf '%s\n' "$spec" >"$PREFIX/.installed-spec"
  # Keep the previous environment: the running agent still imports from it until the restart
  # below, and it is the way back (ln -sfn venvs/<previous> /opt/mbridge/current).
  find "$PREFIX/venvs" -mindepth 1 -maxdepth 1 ! -name "$id" ! -name "$previous" -exec rm -rf {} +
  log "installed $spec in $venv"
}

# ---------------------------------------------------------------- the unit

# Sets UNIT_CHANGED=1 when the installed unit differs from the one the last run started.
install_unit() {
  local source="$UNIT_ARG" here
  if [ -z "$source" ] && [ ! -f "$UNIT_PATH" ]; then
    here="$(cd "$(dirname "$0")" && pwd)"
    [ -f "$here/$UNIT_NAME" ] && source="$here/$UNIT_NAME"
  fi
  if [ -n "$source" ]; then
    [ -f "$source" ] || die "unit file not found: $source"
    if ! cmp -s "$source" "$UNIT_PATH" 2>/dev/null; then
      mkdir -p "$(dirname "$UNIT_PATH")"
      cp "$source" "$UNIT_PATH.tmp"
      mv -f "$UNIT_PATH.tmp" "$UNIT_PATH"
      log "installed $UNIT_PATH from $source"
    fi
  fi
  [ -f "$UNIT_PATH" ] ||
    die "no unit file: pass --unit FILE, or write $UNIT_PATH first (cloud-init and the GCE startup script do)"
  chmod 0644 "$UNIT_PATH"
  chown root:root "$UNIT_PATH"
  UNIT_HASH="$(sha256_of "$UNIT_PATH")"
  if stamp_changed "$PREFIX/.installed-unit.sha256" "$UNIT_HASH"; then UNIT_CHANGED=1; fi
}

# ---------------------------------------------------------------- the check

# `mbridge agent --check` as the service's user with the service's environment: it proves the
# metadata service, the VM's name and the bus credentials, and that agent.env is readable.
run_check() {
  local assignments=() output rc
  if ! command -v runuser >/dev/null 2>&1; then
    warn "runuser not found; skipping 'mbridge agent --check'"
    return 0
  fi
  mapfile -t assignments < <(env_assignments "$AGENT_ENV")
  log "running 'mbridge agent --check' as $SERVICE_USER (Azure's first metadata call may take up to 2 minutes)"
  set +e
  # umask 077 as the unit's UMask=: files the check creates (the local bus) stay private.
  output="$(umask 077 && timeout 200 runuser -u "$SERVICE_USER" -- env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    MBRIDGE_STATE_DIR="$STATE_DIR" ${assignments[@]+"${assignments[@]}"} \
    "$PREFIX/bin/mbridge" agent --check 2>&1)"
  rc=$?
  set -e
  printf '%s\n' "$output" | sed 's/^/mbridge-install:   | /' >&2
  case "$rc" in
    0) log "check: healthy" ;;
    2) die "$AGENT_ENV has a configuration error (above): fix it and run this installer again" ;;
    124) warn "the check did not finish in 200 s" ;;
    *) warn "the check found problem(s) (above)" ;;
  esac
  if [ "$rc" != 0 ]; then
    # The usual causes at first boot are transient: a role assignment or a managed identity that
    # has not propagated yet, a bus entity deployed a minute later. The agent retries all of
    # them on its own, so starting it is better than leaving the VM without one.
    [ "$STRICT_CHECK" = 0 ] || die "--strict-check: not starting the agent"
    warn "starting the agent anyway: it keeps retrying; see 'journalctl -u mbridge-agent'"
  fi
}

# ---------------------------------------------------------------- main

if [ -z "$ROOT" ] && [ "$(id -u)" != 0 ]; then
  die "run me as root (sudo $0)"
fi
command -v "$SYSTEMCTL" >/dev/null 2>&1 || die "systemctl not found: this installer needs systemd"

mkdir -p "$ROOT/run"
if command -v flock >/dev/null 2>&1; then
  # cloud-init and a rollout through run-command may start this at the same time.
  exec 9>"$ROOT/run/mbridge-install.lock"
  flock -w 900 9 || die "another mbridge-install has been running for 15 minutes"
fi

if [ "$UNINSTALL" = 1 ]; then
  uninstall
  exit 0
fi

PACKAGE="$PACKAGE_ARG"
PACKAGE_SHA256=""
if [ -f "$INSTALL_ENV" ]; then
  while IFS= read -r assignment; do
    case "$assignment" in
      MBRIDGE_PACKAGE=*) [ -n "$PACKAGE_ARG" ] || PACKAGE="${assignment#MBRIDGE_PACKAGE=}" ;;
      MBRIDGE_PACKAGE_SHA256=*) [ -n "$PACKAGE_ARG" ] || PACKAGE_SHA256="${assignment#MBRIDGE_PACKAGE_SHA256=}" ;;
      PIP_*=*) export "${assignment?}" ;;
      *) warn "$INSTALL_ENV: ignoring ${assignment%%=*} (only MBRIDGE_PACKAGE, MBRIDGE_PACKAGE_SHA256 and PIP_* are read)" ;;
    esac
  done < <(env_assignments "$INSTALL_ENV")
fi
[ -n "$PACKAGE" ] ||
  die "no package: write MBRIDGE_PACKAGE=<pinned requirement or wheel URL> to $INSTALL_ENV, or pass --package SPEC"
[ -f "$AGENT_ENV" ] ||
  die "$AGENT_ENV is missing: write the agent's settings there first (examples: infra/agent/examples/)"
resolve_package "$PACKAGE" "$PACKAGE_SHA256"
PACKAGE="$INSTALL_SPEC"

if ! find_python; then
  log "no python3 >= 3.9 with venv found; installing one"
  install_python || die "cannot install python3 >= 3.9 with venv: install it (Debian/Ubuntu: python3-venv) and run again"
fi

if ! getent group "$SERVICE_USER" >/dev/null; then
  groupadd --system "$SERVICE_USER" || die "groupadd $SERVICE_USER failed"
fi
if ! getent passwd "$SERVICE_USER" >/dev/null; then
  NOLOGIN="$(command -v nologin || echo /usr/sbin/nologin)"
  useradd --system --gid "$SERVICE_USER" --no-create-home --home-dir /nonexistent --shell "$NOLOGIN" \
    --comment "maintenance-bridge agent" "$SERVICE_USER" || die "useradd $SERVICE_USER failed"
  log "created the system user $SERVICE_USER"
fi

PACKAGE_CHANGED=0
UNIT_CHANGED=0
ENV_CHANGED=0
if [ "$FORCE" = 1 ] || stamp_changed "$PREFIX/.installed-spec" "$PACKAGE" || ! venv_works; then
  install_package "$PACKAGE"
  PACKAGE_CHANGED=1
else
  log "$PACKAGE is already installed; skipping pip (--force reinstalls)"
fi

install_unit

# Configuration: readable by the agent's group, never by other users (it may hold a SAS
# connection string). install.env may hold a private index's credentials: root only.
chmod 0755 "$ETC_DIR"
chown root:"$SERVICE_USER" "$AGENT_ENV"
chmod 0640 "$AGENT_ENV"
if [ -f "$INSTALL_ENV" ]; then
  chown root:root "$INSTALL_ENV"
  chmod 0600 "$INSTALL_ENV"
fi
ENV_HASH="$(sha256_of "$AGENT_ENV")"
if stamp_changed "$PREFIX/.installed-env.sha256" "$ENV_HASH"; then ENV_CHANGED=1; fi

# systemd creates both at start (StateDirectory=, LogsDirectory=); the check runs before that.
mkdir -p "$STATE_DIR" "$LOG_DIR"
chown "$SERVICE_USER:$SERVICE_USER" "$STATE_DIR" "$LOG_DIR"
chmod 0700 "$STATE_DIR" "$LOG_DIR"

if [ "$CHECK" = 1 ]; then run_check; fi

"$SYSTEMCTL" daemon-reload || die "systemctl daemon-reload failed"
"$SYSTEMCTL" enable --quiet "$UNIT_NAME" || die "systemctl enable $UNIT_NAME failed"
if [ "$PACKAGE_CHANGED$UNIT_CHANGED$ENV_CHANGED" != 000 ]; then
  log "restarting $UNIT_NAME (package changed: $PACKAGE_CHANGED, unit: $UNIT_CHANGED, agent.env: $ENV_CHANGED)"
  "$SYSTEMCTL" restart "$UNIT_NAME" || die "systemctl restart $UNIT_NAME failed; see: journalctl -u mbridge-agent"
else
  "$SYSTEMCTL" start "$UNIT_NAME" || die "systemctl start $UNIT_NAME failed; see: journalctl -u mbridge-agent"
fi
# Record what is running only now: a run that failed above retries the restart next time.
printf '%s\n' "$UNIT_HASH" >"$PREFIX/.installed-unit.sha256"
printf '%s\n' "$ENV_HASH" >"$PREFIX/.installed-env.sha256"

sleep "$SETTLE_SECONDS"
if ! "$SYSTEMCTL" is-active --quiet "$UNIT_NAME"; then
  "$SYSTEMCTL" status --no-pager --lines=20 "$UNIT_NAME" >&2 || true
  die "$UNIT_NAME is not running (status above); it keeps restarting every 2 s until it can"
fi
log "$UNIT_NAME is running: systemctl status mbridge-agent; journalctl -u mbridge-agent; curl -s localhost:9797/healthz"
