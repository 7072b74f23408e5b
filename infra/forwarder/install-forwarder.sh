#!/usr/bin/env bash
# Installs (or upgrades) the Scheduled Events forwarder on a Linux VM, offline: no PyPI.
# Run as root, from the directory holding the bundle (the CustomScript extension's working dir):
#   bash install-forwarder.sh --bundle se-forwarder-linux.tar.gz --config-base64 <base64 of config.json>
#   bash install-forwarder.sh --bundle se-forwarder-linux.tar.gz --config-file ./config.json
#   bash install-forwarder.sh --uninstall [--purge]
# The bundle (make wheelhouse) holds wheels/, requirements-vm.txt, se-forwarder.service, forwarder.md.
# Needs python3 >= 3.9 with the venv module (python3-venv on Debian/Ubuntu; installed from the
# distro's own repositories if missing). --uninstall stops and removes the service, the program and the
# config the install wrote; the outbox (/var/lib/se-forwarder) and the service user stay unless --purge.
# Step by step, with checks: docs/forwarder.md, "Install on one VM by hand".
set -euo pipefail

# SE_FORWARDER_ROOT: a directory every path lives under (tests; building an image). Empty on a VM.
ROOT="${SE_FORWARDER_ROOT:-}"
PREFIX="$ROOT/opt/se-forwarder"
CONFIG_DIR="$ROOT/etc/se-forwarder"
STATE_DIR="$ROOT/var/lib/se-forwarder"
SERVICE_USER=se-forwarder
UNIT="$ROOT/etc/systemd/system/se-forwarder.service"

bundle=""
config_b64=""
config_file=""
uninstall=0
purge=0
python_bin="${SE_FORWARDER_PYTHON:-python3}"

die() { echo "install-forwarder: error: $*" >&2; exit 1; }
log() { echo "install-forwarder: $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="${2:-}"; shift 2 ;;
    --config-base64) config_b64="${2:-}"; shift 2 ;;
    --config-file) config_file="${2:-}"; shift 2 ;;
    --python) python_bin="${2:-}"; shift 2 ;;
    --uninstall) uninstall=1; shift ;;
    --purge) purge=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

[ "$(id -u)" -eq 0 ] || die "run as root"
[ "$purge" -eq 0 ] || [ "$uninstall" -eq 1 ] || die "--purge goes with --uninstall"

do_uninstall() {  # the reverse of the install below, in reverse order; safe to run twice
  if command -v systemctl >/dev/null; then
    log "stopping and disabling se-forwarder.service"
    systemctl disable --now se-forwarder.service >/dev/null 2>&1 || true
  fi
  rm -f "$UNIT"
  rm -rf "$UNIT.d"  # the backoff drop-in (systemd >= 254)
  if command -v systemctl >/dev/null; then
    systemctl daemon-reload
    systemctl reset-failed se-forwarder.service >/dev/null 2>&1 || true
  fi
  log "removing $PREFIX"
  rm -rf "$PREFIX"
  if [ "$purge" -eq 1 ]; then
    log "--purge: removing $CONFIG_DIR (hooks included) and $STATE_DIR (the outbox: unsent envelopes are lost)"
    rm -rf "$CONFIG_DIR" "$STATE_DIR"
    if id "$SERVICE_USER" >/dev/null 2>&1; then userdel "$SERVICE_USER" || log "warning: userdel $SERVICE_USER failed"; fi
  else
    # What the install wrote: config.json and the *.example hooks. Hooks someone added stay.
    rm -f "$CONFIG_DIR/config.json"
    find "$CONFIG_DIR/hooks" -name '*.example' -type f -delete 2>/dev/null || true
    for d in "$CONFIG_DIR/hooks/pre-approve.d" "$CONFIG_DIR/hooks/post-event.d" "$CONFIG_DIR/hooks" "$CONFIG_DIR"; do
      rmdir "$d" 2>/dev/null || true
    done
    [ ! -d "$CONFIG_DIR" ] || log "kept $CONFIG_DIR: it holds files the install did not put there (your hooks)"
    [ ! -d "$STATE_DIR" ] || log "kept $STATE_DIR (the outbox) and the user $SERVICE_USER: a reinstall sends what is left; --purge removes them"
  fi
  log "uninstalled"
}
if [ "$uninstall" -eq 1 ]; then do_uninstall; exit 0; fi
[ -n "$bundle" ] && [ -f "$bundle" ] || die "bundle not found: '${bundle}' (give --bundle se-forwarder-linux.tar.gz)"
[ -n "$config_b64" ] || [ -n "$config_file" ] || die "give --config-base64 or --config-file"
command -v systemctl >/dev/null || die "systemd is required (systemctl not found)"

ensure_python() {
  if ! command -v "$python_bin" >/dev/null; then
    die "$python_bin not found: install Python >= 3.9 from the distro, or pass --python /path/to/python3"
  fi
  "$python_bin" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
    || die "$("$python_bin" -V 2>&1) is too old: the forwarder needs Python >= 3.9"
  if ! "$python_bin" -c 'import ensurepip, venv' 2>/dev/null; then
    log "python venv module missing: installing it from the distro repositories"
    if command -v apt-get >/dev/null; then
      minor="$("$python_bin" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q "python${minor}-venv" || apt-get install -y -q python3-venv
    elif command -v dnf >/dev/null; then dnf install -y -q python3-pip
    elif command -v yum >/dev/null; then yum install -y -q python3-pip
    elif command -v zypper >/dev/null; then zypper --non-interactive install python3-pip
    fi
    "$python_bin" -c 'import ensurepip, venv' 2>/dev/null || die "cannot create a venv: install python3-venv"
  fi
}

workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT

log "unpacking $bundle"
tar -xzf "$bundle" -C "$workdir"
[ -d "$workdir/wheels" ] && [ -f "$workdir/requirements-vm.txt" ] && [ -f "$workdir/se-forwarder.service" ] \
  || die "bundle is incomplete: it needs wheels/, requirements-vm.txt and se-forwarder.service"

ensure_python

if ! id "$SERVICE_USER" >/dev/null 2>&1; then
  log "creating system user $SERVICE_USER"
  useradd --system --no-create-home --home-dir "$STATE_DIR" --shell /usr/sbin/nologin \
    --user-group "$SERVICE_USER" 2>/dev/null \
    || useradd --system --no-create-home --home-dir "$STATE_DIR" --shell /sbin/nologin "$SERVICE_USER"
fi

log "installing into $PREFIX (offline, from the bundle's wheels)"
mkdir -p "$PREFIX"
rm -rf "$PREFIX/wheels"
cp -r "$workdir/wheels" "$PREFIX/wheels"
cp "$workdir/requirements-vm.txt" "$PREFIX/requirements-vm.txt"
# The unit's Documentation= page (docs/forwarder.md), readable on the VM without network.
if [ -f "$workdir/forwarder.md" ]; then cp "$workdir/forwarder.md" "$PREFIX/forwarder.md"; fi
# Each install builds a new release directory at the path it keeps for good: pip writes that path into
# the console scripts' first line, so a venv cannot be built in one place and renamed to another.
# $PREFIX/venv is a symlink to the current release, swapped in one rename once the new one works: a
# failed build leaves the running release in place, and systemd runs venv/bin/se-forwarder through it.
release="venv-$(date -u +%Y%m%d%H%M%S)-$$"
"$python_bin" -m venv "$PREFIX/$release"
if ! "$PREFIX/$release/bin/python" -m pip install --quiet --no-index --find-links "$PREFIX/wheels" \
     --disable-pip-version-check -r "$PREFIX/requirements-vm.txt" scheduled-events-forwarder \
   || ! "$PREFIX/$release/bin/se-forwarder" --version; then
  rm -rf "${PREFIX:?}/$release"
  die "the new release does not run; the installed one (if any) is unchanged"
fi
previous=""
if [ -L "$PREFIX/venv" ]; then
  previous="$(readlink "$PREFIX/venv")"
elif [ -d "$PREFIX/venv" ]; then  # a plain directory, from an install before releases
  previous="venv-before-$$"
  mv "$PREFIX/venv" "$PREFIX/$previous"
fi
ln -sfn "$release" "$PREFIX/venv.swap"
mv -Tf "$PREFIX/venv.swap" "$PREFIX/venv"
# What systemd will run (ExecStart), by the path it uses, after the swap.
if ! "$PREFIX/venv/bin/se-forwarder" --version >/dev/null; then
  if [ -n "$previous" ]; then ln -sfn "$previous" "$PREFIX/venv.swap" && mv -Tf "$PREFIX/venv.swap" "$PREFIX/venv"; fi
  rm -rf "${PREFIX:?}/$release"
  die "$PREFIX/venv/bin/se-forwarder does not run after the swap; the previous release is back"
fi
chmod -R go-w "$PREFIX"

log "writing $CONFIG_DIR/config.json"
install -d -m 0750 -o root -g "$SERVICE_USER" "$CONFIG_DIR" "$CONFIG_DIR/hooks" \
  "$CONFIG_DIR/hooks/pre-approve.d" "$CONFIG_DIR/hooks/post-event.d"
tmp_config="$workdir/config.json"
if [ -n "$config_b64" ]; then
  printf '%s' "$config_b64" | base64 -d > "$tmp_config" || die "--config-base64 is not valid base64"
else
  cp "$config_file" "$tmp_config"
fi
"$python_bin" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert isinstance(d, dict)' "$tmp_config" \
  || die "the config is not a JSON object"
install -m 0640 -o root -g "$SERVICE_USER" "$tmp_config" "$CONFIG_DIR/config.json"
# Documented example hooks, as *.example files the forwarder never runs (copy one without the suffix
# to enable it); an existing file is left alone.
"$PREFIX/venv/bin/python" -c 'import sys; from forwarder.hooks import install_examples; install_examples(sys.argv[1])' \
  "$CONFIG_DIR/hooks"
install -d -m 0750 -o "$SERVICE_USER" -g "$SERVICE_USER" "$STATE_DIR"

log "installing the systemd unit"
install -m 0644 "$workdir/se-forwarder.service" "$UNIT"
# The growing restart backoff needs systemd >= 254 (older ones log "Unknown key"): a drop-in there only.
systemd_version="$(systemctl --version | awk 'NR == 1 { print $2 + 0 }')"
rm -f "$UNIT.d/backoff.conf"
if [ "${systemd_version:-0}" -ge 254 ]; then
  install -d -m 0755 "$UNIT.d"
  printf '# install-forwarder.sh: systemd %s has RestartSteps (>= 254)\n[Service]\nRestartSteps=10\nRestartMaxDelaySec=300\n' \
    "$systemd_version" > "$UNIT.d/backoff.conf"
fi
rmdir "$UNIT.d" 2>/dev/null || true
systemctl daemon-reload
systemctl enable se-forwarder.service >/dev/null
systemctl restart se-forwarder.service

# One check pass as the service user: identity, IMDS, config. Reported, not fatal (IMDS's first
# call may take minutes, and the service retries on its own).
if command -v runuser >/dev/null; then
  SE_FORWARDER_STATE_DIR="$STATE_DIR" timeout 150 runuser -u "$SERVICE_USER" -- \
    "$PREFIX/venv/bin/se-forwarder" check --config "$CONFIG_DIR/config.json" \
    || log "warning: 'se-forwarder check' did not pass yet; see: journalctl -u se-forwarder"
fi

# Running means staying up: the same process (MainPID) active for STABLE_SECONDS with no restart.
# A unit that exits at once is "active" for a moment before systemd sees it fail.
stable_seconds="${SE_FORWARDER_STABLE_SECONDS:-10}"
since="" pid="" deadline=$((SECONDS + stable_seconds + 60))
while [ "$SECONDS" -lt "$deadline" ]; do
  state="$(systemctl show -p ActiveState --value se-forwarder.service)"
  now_pid="$(systemctl show -p MainPID --value se-forwarder.service)"
  if [ "$state" = active ] && [ "${now_pid:-0}" != 0 ]; then
    if [ "$now_pid" != "$pid" ]; then pid="$now_pid" since="$SECONDS"; fi
    [ $((SECONDS - since)) -lt "$stable_seconds" ] || break
  else
    pid="" since=""
    if [ "$state" = failed ]; then break; fi
  fi
  sleep 1
done
if [ -z "$since" ] || [ $((SECONDS - since)) -lt "$stable_seconds" ]; then
  status="$(systemctl show -p ExecMainStatus --value se-forwarder.service)"
  systemctl --no-pager status se-forwarder.service 2>&1 | tail -n 15 >&2 || true
  die "se-forwarder.service does not stay up (state ${state:-unknown}, last exit status ${status:-?}; exit codes: $PREFIX/forwarder.md): journalctl -u se-forwarder"
fi
# The service runs the new release: older ones go.
for old in "$PREFIX"/venv-*; do
  [ "$(basename "$old")" = "$release" ] || rm -rf "$old"
done
log "done: se-forwarder.service is running (pid $pid, up ${stable_seconds} s)"
