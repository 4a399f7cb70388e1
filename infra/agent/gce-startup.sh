#!/usr/bin/env bash
# GCE startup script (metadata key `startup-script`) for the maintenance-bridge agent.
#
# The guest environment runs it as root at every boot. It copies four instance (or template)
# metadata attributes to the files that install-agent.sh reads, then runs it; the installer
# only rebuilds or restarts what changed, so a reboot after a metadata change applies it.
#
#   mbridge-agent-env        -> /etc/mbridge/agent.env           (KEY=value lines)
#   mbridge-package          -> /etc/mbridge/install.env         (as MBRIDGE_PACKAGE=<value>)
#   mbridge-agent-unit       -> /etc/systemd/system/mbridge-agent.service
#   mbridge-install-script   -> /usr/local/sbin/mbridge-install  (install-agent.sh)
#
# mbridge-package must name one exact package, or the installer refuses it: the agent's artifact
# (make agent-artifact) with its hash, which the installer checks before running anything from it:
#   https://.../mbridge-agent-pubsub-X.Y.Z.pex#sha256=<hex>
#
# Anyone who can set these attributes can run code as root on the VM, exactly like with
# `startup-script` itself: grant compute.instances.setMetadata accordingly.
set -eu
set -o pipefail
# Files are created private and then given their mode: agent.env may hold a connection string.
umask 077

METADATA="${MBRIDGE_STARTUP_METADATA_URL:-http://metadata.google.internal/computeMetadata/v1/instance/attributes}"
# Empty on a VM; the tests run the script in a scratch directory (and the installer with it).
ROOT="${MBRIDGE_INSTALL_ROOT:-}"
TAG="mbridge-startup"

say() {
  # The startup-script runner copies stdout/stderr to the serial console; logger adds the
  # journal (`journalctl -t mbridge-startup`).
  printf '%s: %s\n' "$TAG" "$*" >&2
  logger -t "$TAG" -- "$*" 2>/dev/null || true
}
fail() {
  say "ERROR: $*"
  exit 1
}

# Writes the attribute $1 to the file $2. The metadata server can be slow or briefly
# unavailable right after boot and during maintenance (503): five tries, 1 to 8 s apart.
# 404 means the attribute is not set, which no retry fixes.
fetch() {
  local key="$1" target="$2" code attempt delay=1
  for attempt in 1 2 3 4 5; do
    code="$(curl -sS --max-time 10 -H 'Metadata-Flavor: Google' -o "$target" -w '%{http_code}' \
      "$METADATA/$key" 2>/dev/null)" || code="000"
    case "$code" in
      200) return 0 ;;
      404) fail "instance metadata attribute '$key' is not set; add it to the instance or its template (infra/agent/README.md)" ;;
    esac
    say "metadata attribute '$key': HTTP $code (try $attempt of 5)"
    [ "$attempt" -lt 5 ] || break
    sleep "$delay"
    delay=$((delay * 2))
  done
  fail "cannot read metadata attribute '$key' from the metadata server (last HTTP status $code)"
}

# Replace $2 by $1 with mode $3, atomically: a copy next to the target, then a rename, so a
# reader never sees half a file.
put() {
  cp "$1" "$2.new"
  chmod "$3" "$2.new"
  mv -f "$2.new" "$2"
}

mkdir -p "$ROOT/etc/mbridge" "$ROOT/etc/systemd/system" "$ROOT/usr/local/sbin"
WORK="$(mktemp -d "$ROOT/etc/mbridge/.startup.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

fetch mbridge-agent-env "$WORK/agent.env"
fetch mbridge-package "$WORK/package"
fetch mbridge-agent-unit "$WORK/unit"
fetch mbridge-install-script "$WORK/install"

package="$(tr -d '\r' <"$WORK/package")"
package="${package#"${package%%[![:space:]]*}"}"
package="${package%"${package##*[![:space:]]}"}"
[ -n "$package" ] || fail "metadata attribute 'mbridge-package' is empty; set it to the agent's artifact URL with its #sha256="
case "$package" in
  *$'\n'*) fail "metadata attribute 'mbridge-package' must be one line (the agent's artifact URL with its #sha256=)" ;;
esac
printf 'MBRIDGE_PACKAGE=%s\n' "$package" >"$WORK/install.env"
head -c 2 "$WORK/install" | grep -q '^#!' ||
  fail "metadata attribute 'mbridge-install-script' does not start with #!: set it to infra/agent/install-agent.sh"

# install-agent.sh gives the mbridge group read access to agent.env once the group exists.
put "$WORK/agent.env" "$ROOT/etc/mbridge/agent.env" 0640
put "$WORK/install.env" "$ROOT/etc/mbridge/install.env" 0600
put "$WORK/unit" "$ROOT/etc/systemd/system/mbridge-agent.service" 0644
put "$WORK/install" "$ROOT/usr/local/sbin/mbridge-install" 0755

say "running /usr/local/sbin/mbridge-install"
if "$ROOT/usr/local/sbin/mbridge-install"; then
  say "maintenance-bridge agent installed and running"
else
  status=$?
  fail "mbridge-install failed with status $status (its messages are above)"
fi
