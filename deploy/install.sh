#!/bin/sh
# plexus node installer (thin mode), run by the plexus DaemonSet container.
#
#  1. installs the plexus binaries into the host CNI bin dir: copy to a temp file in that dir, then
#     rename over the old one; never written in place (a running binary gives "text file busy");
#     `sriov` as --sriov-binary says (install, skip: the SR-IOV network operator's sriov-cni
#     serves, auto), once per start: the watch loop never copies a binary;
#  2. writes <conf-dir>/plexus.d/plexus.kubeconfig (0600, dir 0700) from the service account;
#  3. writes the plexus CNI config (00-plexus.conflist/.conf) from the first primary CNI config:
#     cniVersion (--cni-version, default auto: the primary's, with cniVersions adding 1.1.0 so
#     that a runtime whose libcni knows 1.1.0 runs plexus at 1.1.0 and calls its STATUS, and an
#     older one keeps the primary's version; see deploy/README.md); temp file + rename, then the identical bytes are rewritten in place so that containerd 1.6,
#     which reloads only on write events, sees the new config; the old config is never removed;
#  4. with --watch, re-checks the token, the CA, the primary config and its own config every few
#     seconds and regenerates what changed. It never removes the config, not even on exit.
#  With --ready-file, that file is removed at start and created once 1-3 are done (the
#  DaemonSet's readiness probe: a config left by an earlier version must not make a new pod Ready).
#  With --uninstall, instead (docs/upgrade.md): marks the config `uninstalling` (new pods get the
#  cluster network alone, told by an event), waits until no saved plan has a secondary network
#  (those pods are deleted or drained; their DEL still runs through plexus), then removes the
#  config, the binaries, plexus.d, the state dir and the runtime's result cache of plexus' network.
#
# Needs: sh, coreutils (cp, mv, dd, sha256sum, base64, cut, tr, head, sort, wc, stat, timeout),
# diffutils (cmp), grep, findutils (find), jq. See deploy/README.md and docs/image.md.
set -eu

export LC_ALL=C # byte-order globbing, like libcni's sort.Strings

BIN_DIR=${PLEXUS_BIN_DIR:-/host/opt/cni/bin}
SRC_DIR=${PLEXUS_SRC_DIR:-/usr/src/plexus/bin}
BINARIES=${PLEXUS_BINARIES:-plexus sriov}
CONF_DIR=${PLEXUS_CONF_DIR:-/host/etc/cni/net.d}
HOST_CONF_DIR=${PLEXUS_HOST_CONF_DIR:-/etc/cni/net.d}
REPLACE_SRIOV_CNI=${PLEXUS_REPLACE_SRIOV_CNI:-false}
SRIOV_BINARY=${PLEXUS_SRIOV_BINARY:-install}
CONF_NAME=${PLEXUS_CONF_NAME:-auto}
PRIMARY=${PLEXUS_PRIMARY:-auto}
PRIMARY_WAIT=${PLEXUS_PRIMARY_WAIT_SECONDS:-120}
CNI_VERSION=${PLEXUS_CNI_VERSION:-auto}
NETWORK_NAME=${PLEXUS_NETWORK_NAME:-plexus-cni-network}
LOG_FILE=${PLEXUS_LOG_FILE:-/var/log/plexus.log}
LOG_LEVEL=${PLEXUS_LOG_LEVEL:-warn}
EXTRA_CONFIG=${PLEXUS_EXTRA_CONFIG:-\{\}}
NAD_POLICY_DIR=${PLEXUS_NAD_POLICY_DIR:-}
NODE_NAME=${PLEXUS_NODE_NAME:-}
SA_DIR=/var/run/secrets/kubernetes.io/serviceaccount
TOKEN_FILE=${PLEXUS_TOKEN_FILE:-$SA_DIR/token}
CA_FILE=${PLEXUS_CA_FILE:-$SA_DIR/ca.crt}
SKIP_BINARIES=false
SKIP_KUBECONFIG=false
WATCH=false
WATCH_INTERVAL=${PLEXUS_WATCH_INTERVAL:-5}
RECONCILE_INTERVAL=${PLEXUS_RECONCILE_INTERVAL:-60}
READY_FILE=${PLEXUS_READY_FILE:-}
UNINSTALL=${PLEXUS_UNINSTALL:-false}
STATE_DIR=${PLEXUS_STATE_DIR:-}
CNI_CACHE_DIR=${PLEXUS_CNI_CACHE_DIR:-/var/lib/cni/results}
SETTLE=${PLEXUS_UNINSTALL_SETTLE_SECONDS:-10}

usage() {
	cat <<'EOF'
usage: install.sh [options]            (each option also has a PLEXUS_* environment variable)
  --bin-dir DIR             CNI bin dir, as mounted here       [/host/opt/cni/bin]
  --src-dir DIR             where the binaries to install are  [/usr/src/plexus/bin]
  --binaries "A B"          binaries to install                [plexus sriov]
  --skip-binaries           do not install binaries
  --sriov-binary MODE       who owns <bin-dir>/sriov (docs/migrating.md, "Operator-managed
                            clusters"; the SR-IOV network operator's config daemon copies its
                            sriov-cni there at every start of its pod):
                            install: plexus' sriov is installed. Another sriov plugin there
                              (sriov-cni) stops the installer, unless PLEXUS_REPLACE_SRIOV_CNI=true
                              (drain SR-IOV pods first): then it is replaced once; if another
                              sriov plugin is back later (a DaemonSet that installs its own), the
                              installer stops instead of overwriting it in turn
                            skip: plexus never installs sriov; the one there (the operator's
                              sriov-cni) serves plexus' SR-IOV NADs
                            auto: plexus' sriov is installed where there is none or plexus' own;
                              another sriov plugin is left in place (for mixed clusters)
                            The watch loop never copies binaries; it logs when sriov changes
                                                                                   [install]
  --conf-dir DIR            CNI conf dir, as mounted here      [/host/etc/cni/net.d]
  --host-conf-dir DIR       the same dir as the host sees it   [/etc/cni/net.d]
  --conf-name NAME          00-plexus.conflist, 00-plexus.conf, or auto
                            (auto: .conflist, .conf only for a --cni-version 0.x) [auto]
  --primary NAME            primary config file name, or auto (first *.conf/*.conflist in byte
                            order not starting with 00-plexus or 00-multus)   [auto]
  --primary-wait SECONDS    how long to wait for a usable primary config      [120]
  --cni-version VERSION     plexus' own cniVersion, or auto: the primary's (1.0.0 when it has
                            none, 1.1.0 at most) plus "cniVersions": [that, "1.1.0"], so a
                            runtime with libcni >= 1.2 (containerd >= 2.0, CRI-O) runs plexus
                            at 1.1.0 and calls its STATUS, an older one (containerd 1.6)
                            the primary's version. A version (e.g. 1.0.0) is written alone:
                            below 1.1.0 no runtime calls STATUS. Delegates always run at
                            their own conflist's version                      [auto]
  --network-name NAME       [plexus-cni-network]
  --log-file PATH           logFile in the generated config    [/var/log/plexus.log]
  --log-level LEVEL         logLevel in the generated config   [warn]
  --extra-config JSON       object merged into the plexus plugin config (e.g. namespaceIsolation)
  --node-name NAME          this Node's name (the DaemonSet's spec.nodeName): nodeName in the
                            config, the node plexus names in address claims and events
                            (default: the host name, which may differ from the Node's name)
  --nad-policy-dir DIR      the plexus-nad-policy ConfigMap, mounted (one file per key): its
                            allowances and paths become nadPolicy (docs/security.md); a missing
                            dir is no policy beyond the defaults
  --token-file PATH         service account token (PLEXUS_TOKEN=<token> instead also works)
  --ca-file PATH            service account CA
  --skip-kubeconfig         no kubeconfig (plexus then runs in-cluster or in static mode)
  --watch                   keep running; regenerate on token/CA/primary/config changes
  --watch-interval SECONDS  [5]
  --ready-file PATH         removed at start, created once binaries, kubeconfig and config are
                            in place (for a readiness probe)
  --uninstall               remove plexus from the node once no pod on it has a secondary
                            network (new pods meanwhile get the cluster network alone); with
                            --watch it then idles; the ready file says it is done
  --state-dir DIR           plexus' state dir (plans)         [the config's cniDir, else
                                                               /var/lib/cni/plexus]
  --cni-cache-dir DIR       the runtime's libcni result cache  [/var/lib/cni/results]
  --uninstall-settle SECONDS  wait for calls in flight after each config change  [10]
With --watch, thin mode's node reconciler runs every PLEXUS_RECONCILE_INTERVAL seconds [60] (0: never):
`plexus-daemon reconcile` from the src dir over the published config (docs/daemon.md).
The thin DaemonSet sets it to 0 and runs the reconciler in its own `reconcile` container.
Kubernetes API address: KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT and optionally
KUBERNETES_SERVICE_PROTOCOL (https).
EOF
}

log() {
	printf '%s plexus-install: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >&2
}

die() {
	log "error: $*"
	exit 1
}

need_value() {
	[ "$#" -ge 2 ] || die "option $1 needs a value"
}

while [ "$#" -gt 0 ]; do
	opt=$1
	case $opt in
	--*=*)
		# --flag=value: split and re-dispatch as --flag value
		shift
		set -- "${opt%%=*}" "${opt#*=}" "$@"
		continue
		;;
	esac
	case $opt in
	--bin-dir) need_value "$@"; BIN_DIR=$2; shift ;;
	--src-dir) need_value "$@"; SRC_DIR=$2; shift ;;
	--binaries) need_value "$@"; BINARIES=$2; shift ;;
	--skip-binaries) SKIP_BINARIES=true ;;
	--sriov-binary) need_value "$@"; SRIOV_BINARY=$2; shift ;;
	--conf-dir) need_value "$@"; CONF_DIR=$2; shift ;;
	--host-conf-dir) need_value "$@"; HOST_CONF_DIR=$2; shift ;;
	--conf-name) need_value "$@"; CONF_NAME=$2; shift ;;
	--primary) need_value "$@"; PRIMARY=$2; shift ;;
	--primary-wait) need_value "$@"; PRIMARY_WAIT=$2; shift ;;
	--cni-version) need_value "$@"; CNI_VERSION=$2; shift ;;
	--network-name) need_value "$@"; NETWORK_NAME=$2; shift ;;
	--log-file) need_value "$@"; LOG_FILE=$2; shift ;;
	--log-level) need_value "$@"; LOG_LEVEL=$2; shift ;;
	--extra-config) need_value "$@"; EXTRA_CONFIG=$2; shift ;;
	--nad-policy-dir) need_value "$@"; NAD_POLICY_DIR=$2; shift ;;
	--node-name) need_value "$@"; NODE_NAME=$2; shift ;;
	--token-file) need_value "$@"; TOKEN_FILE=$2; shift ;;
	--ca-file) need_value "$@"; CA_FILE=$2; shift ;;
	--skip-kubeconfig) SKIP_KUBECONFIG=true ;;
	--watch) WATCH=true ;;
	--watch-interval) need_value "$@"; WATCH_INTERVAL=$2; shift ;;
	--ready-file) need_value "$@"; READY_FILE=$2; shift ;;
	--uninstall) UNINSTALL=true ;;
	--state-dir) need_value "$@"; STATE_DIR=$2; shift ;;
	--cni-cache-dir) need_value "$@"; CNI_CACHE_DIR=$2; shift ;;
	--uninstall-settle) need_value "$@"; SETTLE=$2; shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; die "unknown option: $opt" ;;
	esac
	shift
done

case $CONF_NAME in
auto | 00-plexus.conf | 00-plexus.conflist) ;;
*.conf | *.conflist) ;;
*) die "--conf-name must end in .conf or .conflist (got $CONF_NAME)" ;;
esac
case $CNI_VERSION in
auto | 0.1.0 | 0.2.0 | 0.3.0 | 0.3.1 | 0.4.0 | 1.0.0 | 1.1.0) ;;
*) die "--cni-version must be auto or a CNI version plexus implements, 0.1.0 to 1.1.0 (got $CNI_VERSION)" ;;
esac
case $SRIOV_BINARY in
install | skip | auto) ;;
*) die "--sriov-binary must be install, skip or auto (got $SRIOV_BINARY)" ;;
esac
case $REPLACE_SRIOV_CNI in
true | false) ;;
*) die "PLEXUS_REPLACE_SRIOV_CNI must be true or false (got $REPLACE_SRIOV_CNI)" ;;
esac
case $PRIMARY_WAIT in '' | *[!0-9]*) die "--primary-wait must be whole seconds" ;; esac
case $SETTLE in '' | *[!0-9]*) die "--uninstall-settle must be whole seconds" ;; esac
command -v jq >/dev/null 2>&1 || die "jq is required"
printf '%s' "$EXTRA_CONFIG" | jq -e 'type == "object"' >/dev/null 2>&1 ||
	die "--extra-config must be a JSON object"

PLEXUS_D=$CONF_DIR/plexus.d
KUBECONFIG_PATH=$PLEXUS_D/plexus.kubeconfig
KUBECONFIG_HOST_PATH=$HOST_CONF_DIR/plexus.d/plexus.kubeconfig

# Temp files in flight, removed on any exit. Never the published files.
TMP_FILES=
SLEEP_PID=
track() {
	for t in "$@"; do
		case " $TMP_FILES " in *" $t "*) ;; *) TMP_FILES="$TMP_FILES $t" ;; esac
	done
}
cleanup() {
	for t in $TMP_FILES; do rm -f "$t"; done
	if [ -n "$SLEEP_PID" ]; then kill "$SLEEP_PID" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'log "signal received; exiting, the config stays in place"; exit 0' TERM INT HUP

# sha256 of a file, or "absent".
hash_of() {
	if [ -f "$1" ]; then
		sha256sum <"$1" | cut -d' ' -f1
	else
		echo absent
	fi
}

# ---------------------------------------------------------------------------------------- binaries

# Whether $1 is plexus' sriov (it names its state-dir variable; sriov-cni does not).
is_plexus_sriov() {
	grep -q PLEXUS_SRIOV_STATE_DIR "$1"
}

# Who provides <bin-dir>/sriov, in words for the log.
sriov_owner() {
	if [ ! -f "$1" ]; then
		echo "none installed"
	elif is_plexus_sriov "$1"; then
		echo "plexus' sriov"
	else
		echo "another sriov plugin (sriov-cni?)"
	fi
}

# Set by PLEXUS_REPLACE_SRIOV_CNI's replacement, kept until uninstall: a foreign sriov seen after
# it was put back by someone else (a DaemonSet that installs sriov-cni at every start).
SRIOV_REPLACED=$PLEXUS_D/sriov-replaced

# Whether plexus installs $1 (a binary name) under --sriov-binary; says why not.
wanted() {
	[ "$1" = sriov ] || return 0
	case $SRIOV_BINARY in
	skip)
		log "$BIN_DIR/sriov not installed (--sriov-binary skip): $(sriov_owner "$BIN_DIR/sriov")"
		return 1
		;;
	auto)
		if [ -f "$BIN_DIR/sriov" ] && ! is_plexus_sriov "$BIN_DIR/sriov"; then
			log "$BIN_DIR/sriov is another sriov plugin (sriov-cni?); left in place (--sriov-binary auto): it serves plexus' SR-IOV NADs"
			return 1
		fi
		;;
	esac
	return 0
}

install_binaries() {
	mkdir -p "$BIN_DIR"
	for b in $BINARIES; do
		wanted "$b" || continue
		src=$SRC_DIR/$b
		dst=$BIN_DIR/$b
		[ -f "$src" ] || die "binary $src not found"
		if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
			log "$dst is up to date"
			continue
		fi
		# Replacing sriov-cni's binary would strand the VFs it attached: their DEL would reach
		# plexus' sriov, which does not know sriov-cni's state and could not restore them.
		replacing=false
		if [ "$b" = sriov ] && [ -f "$dst" ] && ! is_plexus_sriov "$dst"; then
			[ "$REPLACE_SRIOV_CNI" = true ] ||
				die "$dst is another sriov plugin (sriov-cni?): to replace it, drain SR-IOV pods from the node first, then set PLEXUS_REPLACE_SRIOV_CNI=true; to keep it (a node the SR-IOV network operator manages), set PLEXUS_SRIOV_BINARY=skip"
			# Once only: a foreign sriov back after our replacement means another installer
			# (the SR-IOV network operator's config daemon) owns the file; overwriting it again
			# would start a loop in which each DaemonSet's restart strands the other's VFs.
			[ ! -f "$SRIOV_REPLACED" ] ||
				die "$dst is another sriov plugin again after plexus replaced one ($(cat "$SRIOV_REPLACED")): another DaemonSet installs it (the SR-IOV network operator?); not overwriting it in turn. Set PLEXUS_SRIOV_BINARY=skip to let it serve plexus, or stop the other installer and remove $SRIOV_REPLACED"
			replacing=true
		fi
		# Same directory, so mv is a rename(2): atomic, and it works while the old binary is
		# executing (writing into it would fail with ETXTBSY).
		tmp=$BIN_DIR/.$b.plexus-tmp.$$
		track "$tmp"
		cp "$src" "$tmp" || die "cannot copy $src to $BIN_DIR"
		chmod 0755 "$tmp" || die "cannot chmod $tmp"
		mv -f "$tmp" "$dst" || die "cannot rename $tmp to $dst"
		log "installed $dst"
		if [ "$replacing" = true ]; then
			mkdir -p "$PLEXUS_D"
			chmod 0700 "$PLEXUS_D"
			printf 'replaced another sriov plugin at %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$SRIOV_REPLACED" ||
				die "cannot write $SRIOV_REPLACED"
			log "replaced another sriov plugin at $dst (PLEXUS_REPLACE_SRIOV_CNI=true); it will not be replaced again"
		fi
	done
}

# stat of <bin-dir>/sriov (or "absent"): the watch loop logs a change of owner, never copies.
sriov_stat() {
	stat -c '%i %s %Y' "$BIN_DIR/sriov" 2>/dev/null || echo absent
}

# -------------------------------------------------------------------------------------- kubeconfig

# The token (never printed). PLEXUS_TOKEN wins over the token file.
read_token() {
	if [ -n "${PLEXUS_TOKEN:-}" ]; then
		printf '%s' "$PLEXUS_TOKEN"
	else
		[ -r "$TOKEN_FILE" ] || die "service account token $TOKEN_FILE not readable"
		tr -d ' \r\n' <"$TOKEN_FILE"
	fi
}

# Hashes of the token and CA, to notice rotation.
creds_hash() {
	if [ -n "${PLEXUS_TOKEN:-}" ]; then echo env; else hash_of "$TOKEN_FILE"; fi
	hash_of "$CA_FILE"
}

write_kubeconfig() {
	# Hash before reading: a rotation during this call is seen on the next watch pass.
	CREDS=$(creds_hash)
	[ -n "${KUBERNETES_SERVICE_HOST:-}" ] || die "KUBERNETES_SERVICE_HOST is not set"
	[ -n "${KUBERNETES_SERVICE_PORT:-}" ] || die "KUBERNETES_SERVICE_PORT is not set"
	[ -r "$CA_FILE" ] || die "CA file $CA_FILE not readable"
	host=$KUBERNETES_SERVICE_HOST
	case $host in *:*) host="[$host]" ;; esac
	server="${KUBERNETES_SERVICE_PROTOCOL:-https}://$host:$KUBERNETES_SERVICE_PORT"
	ca_data=$(base64 -w0 <"$CA_FILE")
	token=$(read_token)
	[ -n "$token" ] || die "service account token is empty"
	mkdir -p "$PLEXUS_D"
	chmod 0700 "$PLEXUS_D"
	tmp=$PLEXUS_D/.plexus.kubeconfig.tmp.$$
	track "$tmp"
	# printf is a builtin: the token never appears in a process' argv.
	(
		umask 077
		printf '%s\n' \
			"# Generated by the plexus installer; rewritten when the service account token rotates." \
			"apiVersion: v1" \
			"kind: Config" \
			"clusters:" \
			"- name: local" \
			"  cluster:" \
			"    server: $server" \
			"    certificate-authority-data: $ca_data" \
			"users:" \
			"- name: plexus" \
			"  user:" \
			"    token: \"$token\"" \
			"contexts:" \
			"- name: plexus-context" \
			"  context:" \
			"    cluster: local" \
			"    user: plexus" \
			"current-context: plexus-context" >"$tmp"
	) || die "cannot write $tmp"
	token=
	if [ -f "$KUBECONFIG_PATH" ] && cmp -s "$tmp" "$KUBECONFIG_PATH"; then
		rm -f "$tmp"
	else
		mv -f "$tmp" "$KUBECONFIG_PATH" || die "cannot rename $tmp"
		log "wrote $KUBECONFIG_PATH"
	fi
	chmod 0600 "$KUBECONFIG_PATH"
}

# -------------------------------------------------------------------------------- primary config

# Path of the primary config, or failure when there is none yet.
find_primary() {
	if [ "$PRIMARY" != auto ]; then
		[ -f "$CONF_DIR/$PRIMARY" ] || return 1
		printf '%s\n' "$CONF_DIR/$PRIMARY"
		return 0
	fi
	for f in "$CONF_DIR"/*; do
		base=${f##*/}
		case $base in
		00-plexus* | 00-multus* | "$CONF_NAME") continue ;;
		*.conf | *.conflist) ;;
		*) continue ;;
		esac
		[ -f "$f" ] || continue
		printf '%s\n' "$f"
		return 0
	done
	return 1
}

# Parse the primary config: sets P_VERSION (its cniVersion, maybe empty) and P_CAPS. Fails on a
# partial or invalid file.
load_primary() {
	jq -e 'type == "object" and ((.type | type) == "string" or (.plugins | type) == "array")' \
		"$1" >/dev/null 2>&1 || return 1
	# Delegating to a plexus or Multus config would call plexus again and again (Multus #1108).
	if jq -e '[.type, ((.plugins // []) | .[] | .type?)] | any(. == "plexus" or . == "multus"
		or . == "multus-shim")' "$1" >/dev/null 2>&1; then
		log "refusing $1 as the primary config: it is a plexus or Multus config"
		return 1
	fi
	P_VERSION=$(jq -r '.cniVersion // "" | strings' "$1") || return 1
	# Union of the capabilities enabled at the top level (.conf) or in any plugin (.conflist),
	# plus the pod annotations containerd and CRI-O hand to plugins that ask: plexus then needs
	# no GET of the pod on ADD.
	P_CAPS=$(jq -c '[.capabilities, ((.plugins // []) | .[] | .capabilities?)]
		| map(select(type == "object") | to_entries[] | select(.value == true) | {(.key): true})
		| (add // {}) + {"io.kubernetes.cri.pod-annotations": true}' "$1") || return 1
}

# Wait (bounded) for a usable primary config; sets P_PATH, P_VERSION, P_CAPS.
wait_primary() {
	tries=0
	while :; do
		if P_PATH=$(find_primary) && PRIMARY_STATE="$P_PATH $(hash_of "$P_PATH")" &&
			load_primary "$P_PATH"; then
			log "primary CNI config: $P_PATH (cniVersion $P_VERSION)"
			return 0
		fi
		tries=$((tries + 1))
		[ "$tries" -le "$PRIMARY_WAIT" ] ||
			die "no usable primary CNI config (*.conf, *.conflist) in $CONF_DIR after ${PRIMARY_WAIT}s"
		[ "$tries" -gt 1 ] || log "waiting for a primary CNI config in $CONF_DIR"
		sleep 1
	done
}

# --------------------------------------------------------------------------------- plexus config

# plexus' own version for the current primary: sets W_VERSION (cniVersion) and W_VERSIONS
# (cniVersions as a JSON list, or empty). plexus runs each delegate at its own conflist's
# version, so this is only what the runtime and plexus speak: with auto, the primary's version
# (the runtime already reads it) and 1.1.0 offered beside it. libcni >= 1.2 picks the highest
# of cniVersion + cniVersions it implements (1.1.0: STATUS on every CRI Status in containerd
# >= 2.0.1, CRI-O's STATUS and GC); libcni 1.1 (containerd 1.6, which cannot read a 1.1.0
# result) ignores cniVersions.
plexus_versions() {
	if [ "$CNI_VERSION" != auto ]; then
		W_VERSION=$CNI_VERSION
		W_VERSIONS=
		return
	fi
	case $P_VERSION in
	0.1.0 | 0.2.0 | 0.3.0 | 0.3.1 | 0.4.0 | 1.0.0 | 1.1.0) W_VERSION=$P_VERSION ;;
	'') W_VERSION=1.0.0 ;;
	*)
		# Newer than plexus implements (or not a version): the newest plexus speaks.
		if jq -en --arg v "$P_VERSION" '($v | split(".") | map(tonumber? // 0)) > [1, 1, 0]' \
			>/dev/null 2>&1; then
			W_VERSION=1.1.0
		else
			W_VERSION=1.0.0
		fi
		;;
	esac
	W_VERSIONS=
	[ "$W_VERSION" = 1.1.0 ] || W_VERSIONS="[\"$W_VERSION\",\"1.1.0\"]"
}

# Final file name for plexus' version: a single-plugin .conf only for a 0.x version written
# alone (cniVersions needs a .conflist).
conf_name() {
	if [ "$CONF_NAME" != auto ]; then
		printf '%s\n' "$CONF_NAME"
		return
	fi
	case $W_VERSION in
	0.*) [ -n "$W_VERSIONS" ] && echo 00-plexus.conflist || echo 00-plexus.conf ;;
	*) echo 00-plexus.conflist ;;
	esac
}

# nadPolicy from the mounted plexus-nad-policy ConfigMap, on stdout ({} without one). Keys:
# paths.<class> (comma list of dirs), paths.mode, hostResources.mode, trustedNamespaces, and
# the <namespace>.<kind> / _all.<kind> allowances the admission policy reads too.
render_policy() {
	if [ -z "$NAD_POLICY_DIR" ] || [ ! -d "$NAD_POLICY_DIR" ]; then
		echo '{}'
		return
	fi
	policy='{}'
	for f in "$NAD_POLICY_DIR"/*; do
		key=${f##*/}
		# A ConfigMap volume's ..data and timestamped dirs; an empty dir's literal '*'.
		case $key in .* | '*') continue ;; esac
		[ -f "$f" ] || continue
		policy=$(printf '%s' "$policy" | jq -c --arg k "$key" --rawfile v "$f" '
			def list: $v | split(",") | map(gsub("^\\s+|\\s+$"; "")) | map(select(. != ""));
			def word: $v | gsub("\\s"; "");
			if $k == "paths.mode" then .paths.mode = word
			elif $k == "hostResources.mode" then .hostResources.mode = word
			elif $k == "trustedNamespaces" then .trustedNamespaces = list
			elif ($k | startswith("paths.")) then .paths[$k[6:]] = list
			else .hostResources.allow[$k] = ($v | gsub("^\\s+|\\s+$"; "")) end') ||
			die "cannot read $f"
	done
	printf '%s\n' "$policy"
}

# The config for the current primary, on stdout.
render_config() {
	kubeconfig=$KUBECONFIG_HOST_PATH
	[ "$SKIP_KUBECONFIG" = false ] || kubeconfig=
	jq -n \
		--arg version "$W_VERSION" \
		--arg versions "$W_VERSIONS" \
		--arg name "$NETWORK_NAME" \
		--arg kubeconfig "$kubeconfig" \
		--arg cluster "$HOST_CONF_DIR/${P_PATH##*/}" \
		--argjson caps "$P_CAPS" \
		--arg logfile "$LOG_FILE" \
		--arg loglevel "$LOG_LEVEL" \
		--arg node "$NODE_NAME" \
		--argjson extra "$EXTRA_CONFIG" \
		--argjson policy "$POLICY" \
		--arg list "$1" '
		({type: "plexus", kubeconfig: $kubeconfig, clusterNetwork: $cluster,
		  capabilities: $caps, logFile: $logfile, logLevel: $loglevel, nodeName: $node} + $extra
		 + {nadPolicy: (($extra.nadPolicy // {}) * $policy)}
		 | with_entries(select(.value != "" and .value != {}))) as $plugin
		| if $list == "true"
		  then {cniVersion: $version}
		       + (if $versions == "" then {} else {cniVersions: ($versions | fromjson)} end)
		       + {name: $name, plugins: [$plugin]}
		  else {cniVersion: $version, name: $name} + $plugin end'
}

# Publish the config for the current primary. Safe to repeat.
write_config() {
	plexus_versions
	name=$(conf_name)
	final=$CONF_DIR/$name
	list=false
	case $name in *.conflist) list=true ;; esac
	if [ "$list" = false ] && [ -n "$W_VERSIONS" ]; then
		log "$name is a single-plugin config, which cannot offer cniVersions: plexus runs at $W_VERSION and no runtime calls its STATUS (use a .conflist name)"
		W_VERSIONS=
	fi
	mkdir -p "$PLEXUS_D"
	staged=$PLEXUS_D/.config.staged.$$
	tmp=$CONF_DIR/.$name.plexus-tmp.$$ # no .conf/.conflist/.json suffix: libcni ignores it
	track "$staged" "$tmp"
	render_config "$list" >"$staged" || die "cannot render the plexus config"
	# The plexus to be run checks the config first: a typo in the NAD policy ConfigMap must not
	# fail every pod on the node. The first install fails (the pod shows why); later ones keep
	# the config already published.
	checker=$BIN_DIR/plexus
	[ -x "$checker" ] || checker=$SRC_DIR/plexus
	# What the runtime hands plexus: a list's plugin with the list's name and version (daemon
	# mode's plugin is plexus-shim, which `check-config` of the whole list does not look for).
	checked=$staged
	if [ "$list" = true ]; then
		checked=$PLEXUS_D/.config.checked.$$
		track "$checked"
		jq '.plugins[0] + {name, cniVersion}' "$staged" >"$checked" ||
			die "cannot extract the plexus plugin from the config"
	fi
	if [ -x "$checker" ] && ! why=$("$checker" check-config "$checked" 2>&1); then
		rm -f "$staged" "$checked"
		if [ -f "$final" ]; then
			log "the new config is refused by plexus, keeping $final: $why"
			return 0
		fi
		die "the config is refused by plexus: $why"
	fi
	if ! { [ -f "$final" ] && cmp -s "$staged" "$final"; }; then
		cp "$staged" "$tmp" || die "cannot write $tmp"
		chmod 0644 "$tmp"
		# rename(2) over the old config: it never disappears and is never partial.
		mv -f "$tmp" "$final" || die "cannot rename $tmp to $final"
		log "wrote $final (cniVersion $W_VERSION${W_VERSIONS:+, cniVersions $W_VERSIONS})"
	fi
	# containerd 1.6 ignores the Create event of a rename; rewrite the same bytes in place
	# (no truncation, same length) so that it gets a Write event on the complete file.
	if cmp -s "$staged" "$final"; then
		dd if="$staged" of="$final" conv=notrunc status=none || die "cannot rewrite $final"
	fi
	[ "$checked" = "$staged" ] || rm -f "$checked"
	# From what we meant to publish: the final file may already be changed by someone else.
	PUBLISHED_HASH=$(hash_of "$staged")
	PUBLISHED_PATH=$final
	mv -f "$staged" "$PLEXUS_D/.published"
	# A config of the other extension from an earlier run would shadow or duplicate this one.
	# Remove it, then give the runtime one more write event on the final file: containerd 1.6
	# does not reload on a removal, and at the first write event both files still existed.
	removed=false
	for other in "$CONF_DIR/00-plexus.conf" "$CONF_DIR/00-plexus.conflist"; do
		if [ "$other" != "$final" ] && [ -f "$other" ]; then
			rm -f "$other"
			log "removed stale $other"
			removed=true
		fi
	done
	if [ "$removed" = true ] && cmp -s "$PLEXUS_D/.published" "$final" 2>/dev/null; then
		dd if="$PLEXUS_D/.published" of="$final" conv=notrunc status=none || die "cannot rewrite $final"
	fi
	check_not_shadowed "$name"
}

# The runtime loads the first *.conf, *.conflist or *.json in name order (libcni): warn loudly
# and fail when another file (a leftover 00-multus.conf, say) comes before plexus' config.
check_not_shadowed() {
	for f in "$CONF_DIR"/*; do
		base=${f##*/}
		case $base in
		*.conf | *.conflist | *.json) ;;
		*) continue ;;
		esac
		[ -f "$f" ] || continue
		[ "$base" = "$1" ] && return 0
		# Our own file may be gone already (removed by someone else: the next watch pass
		# restores it); only a file that sorts before it shadows it.
		first=$(printf '%s\n%s\n' "$base" "$1" | sort | head -n 1)
		[ "$first" = "$base" ] || return 0
		die "$f sorts before $1: the container runtime would use it instead of plexus; remove it (a leftover Multus config?)"
	done
}

# --------------------------------------------------------------------------------------- uninstall

# The published plexus config, if any.
current_config() {
	for f in "$CONF_DIR/00-plexus.conflist" "$CONF_DIR/00-plexus.conf"; do
		if [ -f "$f" ]; then
			echo "$f"
			return 0
		fi
	done
	return 1
}

# Saved plans (of pods on this node) with a secondary network: their DEL needs plexus.
plans_with_secondaries() {
	[ -d "$STATE_DIR/plans" ] || return 0
	for p in "$STATE_DIR"/plans/*.json; do
		[ -f "$p" ] || continue
		# A plan that cannot be read is waited on too: plexus' DEL knows what to do with it
		# (one that a DEL removed meanwhile is not).
		if ! jq -e '[.attachments[]? | select(.isDefault != true)] | length == 0' "$p" >/dev/null 2>&1; then
			[ -f "$p" ] || continue
			jq -r '(.pod.namespace // "?") + "/" + (.pod.name // "?") + " (" + (.containerId // "?") + ")"' "$p" 2>/dev/null || echo "$p"
		fi
	done
}

uninstall() {
	name=$NETWORK_NAME
	if conf=$(current_config); then
		dir=$(jq -r '(.plugins[0] // .).cniDir // empty' "$conf" 2>/dev/null) || dir=
		[ -n "$STATE_DIR" ] || STATE_DIR=${dir:-/var/lib/cni/plexus}
		name=$(jq -r '.name // empty' "$conf" 2>/dev/null) || name=
		name=${name:-$NETWORK_NAME}
		if ! jq -e '(.plugins[0] // .).uninstalling == true' "$conf" >/dev/null 2>&1; then
			tmp=$CONF_DIR/.${conf##*/}.plexus-tmp.$$
			track "$tmp"
			jq 'if (.plugins | type) == "array" then .plugins[0].uninstalling = true else .uninstalling = true end' \
				"$conf" >"$tmp" || die "cannot mark $conf uninstalling"
			chmod 0644 "$tmp"
			mv -f "$tmp" "$conf" || die "cannot rename $tmp to $conf"
			# containerd 1.6 reloads on a write event, not on the rename's create.
			cp "$conf" "$tmp" && dd if="$tmp" of="$conf" conv=notrunc status=none && rm -f "$tmp"
			log "marked $conf uninstalling: new pods get the cluster network only"
		fi
		# Calls that started under the previous config save their plans first.
		sleep "$SETTLE"
		clear=0
		said=
		said_at=0
		while [ "$clear" -lt 2 ]; do
			left=$(plans_with_secondaries)
			if [ -z "$left" ]; then
				clear=$((clear + 1))
			else
				clear=0
				# Say who is waited for when that changes, and at least every 30 s (wall clock:
				# on a loaded node one pass takes longer than its 2 s sleep).
				now=$(date +%s)
				if [ "$left" != "$said" ] || [ $((now - said_at)) -ge 30 ]; then
					log "waiting for $(printf '%s\n' "$left" | wc -l) pod(s) with secondary networks to be deleted: $(printf '%s\n' "$left" | head -n 5 | tr '\n' ' ')"
					said=$left
					said_at=$now
				fi
			fi
			[ "$clear" -ge 2 ] && break
			sleep 2
		done
		# containerd 1.6 reloads on the remove event: the primary config is first again.
		rm -f "$CONF_DIR/00-plexus.conflist" "$CONF_DIR/00-plexus.conf"
		log "removed $conf: new pods get the cluster network's config alone"
		sleep "$SETTLE"
	fi
	[ -n "$STATE_DIR" ] || STATE_DIR=/var/lib/cni/plexus
	clean_state "$name" || true
	for b in $BINARIES; do
		dst=$BIN_DIR/$b
		[ -f "$dst" ] || continue
		# Never another sriov plugin (sriov-cni) that happens to be installed under that name.
		if [ "$b" = sriov ] && ! grep -q PLEXUS_SRIOV_STATE_DIR "$dst"; then
			log "$dst is not plexus' sriov; left in place"
			continue
		fi
		rm -f "$dst"
		log "removed $dst"
	done
	rm -rf "$PLEXUS_D"
	# ADDs that started under the old config may finish after the first cleanup (seconds on a
	# loaded node): clean again until two passes 2 s apart find nothing (at most a minute).
	quiet=0
	passes=0
	while [ "$quiet" -lt 2 ] && [ "$passes" -lt 30 ]; do
		sleep 2
		passes=$((passes + 1))
		if clean_state "$name"; then
			quiet=$((quiet + 1))
		else
			quiet=0
			log "cleaned what calls that started under the old config wrote since"
		fi
	done
	log "uninstalled"
}

# Empty plexus' state dir and remove the runtime's cached results under plexus' network name
# $1 (their DEL now comes with the primary's name, so nothing would ever remove them). Succeeds
# when there was nothing to remove.
clean_state() {
	found=0
	if [ -d "$STATE_DIR" ] && [ -n "$(find "$STATE_DIR" -mindepth 1 ! -type d 2>/dev/null | head -n 1)" ]; then
		found=1
		find "$STATE_DIR" -mindepth 1 -delete 2>/dev/null || log "could not empty $STATE_DIR"
	fi
	if [ -d "$CNI_CACHE_DIR" ]; then
		for f in "$CNI_CACHE_DIR/$1"-*; do
			[ -f "$f" ] || continue
			found=1
			rm -f "$f"
		done
	fi
	[ "$found" -eq 0 ]
}

# ------------------------------------------------------------------------------------------ main

# A ready file from an earlier run of this pod (a container restart keeps its emptyDir) would
# report the node ready before this run has published anything.
if [ -n "$READY_FILE" ]; then
	rm -f "$READY_FILE" || die "cannot remove $READY_FILE"
fi
if [ "$UNINSTALL" = true ]; then
	uninstall
	if [ -n "$READY_FILE" ]; then
		case $READY_FILE in */*) mkdir -p "${READY_FILE%/*}" ;; esac
		: >"$READY_FILE" || die "cannot create $READY_FILE"
	fi
	[ "$WATCH" = true ] || exit 0
	log "idle (nothing to watch once uninstalled)"
	while :; do
		sleep 3600 &
		SLEEP_PID=$!
		wait "$SLEEP_PID" || true
	done
fi
[ "$SKIP_BINARIES" = true ] || install_binaries
[ "$SKIP_KUBECONFIG" = true ] || write_kubeconfig
wait_primary
POLICY=$(render_policy)
write_config
if [ -n "$READY_FILE" ]; then
	case $READY_FILE in */*) mkdir -p "${READY_FILE%/*}" ;; esac
	: >"$READY_FILE" || die "cannot create $READY_FILE"
	log "ready ($READY_FILE)"
fi

[ "$WATCH" = true ] || exit 0

# Thin mode's node reconciler (docs/daemon.md): no runtime sends GC, so every
# RECONCILE_INTERVAL seconds (the first watch pass too) one bounded pass releases the plans of
# sandboxes the runtime no longer lists. A daemon-mode config is left to the daemon.
# For install.sh run on a host directly: the thin DaemonSet sets PLEXUS_RECONCILE_INTERVAL=0
# here (this container has neither the runtime's socket nor write access to the state) and runs
# the loop in its privileged `reconcile` container instead (plexus-daemon reconcile --every).
LAST_RECONCILE=0
reconcile_due() {
	[ "$RECONCILE_INTERVAL" -gt 0 ] && [ -x "$SRC_DIR/plexus-daemon" ] && [ -n "${PUBLISHED_PATH:-}" ] ||
		return 0
	now=$(date +%s)
	[ $((now - LAST_RECONCILE)) -ge "$RECONCILE_INTERVAL" ] || return 0
	LAST_RECONCILE=$now
	timeout 300 "$SRC_DIR/plexus-daemon" reconcile --config "$PUBLISHED_PATH" --cni-path "$BIN_DIR" ||
		log "node reconciler pass failed (exit $?)"
}

# Binaries are installed once per start, never from this loop: two DaemonSets that both copied
# an sriov on a timer would overwrite each other forever. A change of sriov is only logged.
case " $BINARIES " in *" sriov "*) WATCH_SRIOV=true ;; *) WATCH_SRIOV=false ;; esac
SRIOV_SEEN=$(sriov_stat)
log "watching every ${WATCH_INTERVAL}s"
MISSING_LOGGED=false
while :; do
	sleep "$WATCH_INTERVAL" &
	SLEEP_PID=$!
	wait "$SLEEP_PID" || true
	SLEEP_PID=
	reconcile_due
	if [ "$WATCH_SRIOV" = true ] && [ "$(sriov_stat)" != "$SRIOV_SEEN" ]; then
		SRIOV_SEEN=$(sriov_stat)
		log "$BIN_DIR/sriov changed: now $(sriov_owner "$BIN_DIR/sriov"); not reinstalled (--sriov-binary $SRIOV_BINARY; binaries are installed when this pod starts)"
	fi
	if [ "$SKIP_KUBECONFIG" = false ]; then
		if [ "$(creds_hash)" != "$CREDS" ]; then
			log "service account token or CA changed"
			write_kubeconfig
		elif [ ! -f "$KUBECONFIG_PATH" ]; then
			log "$KUBECONFIG_PATH was removed; restoring it"
			write_kubeconfig
		fi
	fi
	if ! p=$(find_primary); then
		# Keep the old config: a missing primary is usually a restart of the primary CNI.
		[ "$MISSING_LOGGED" = true ] || log "primary CNI config is gone; waiting, $PUBLISHED_PATH stays"
		MISSING_LOGGED=true
		continue
	fi
	MISSING_LOGGED=false
	state="$p $(hash_of "$p")"
	if [ "$state" != "$PRIMARY_STATE" ]; then
		# Hashed before parsing: a change during the parse is seen on the next pass.
		if load_primary "$p"; then
			log "primary CNI config changed: $p (cniVersion $P_VERSION)"
			P_PATH=$p
			PRIMARY_STATE=$state
			write_config
		fi
		continue
	fi
	if ! policy=$(render_policy); then
		continue
	fi
	if [ "$policy" != "$POLICY" ]; then
		log "NAD policy changed ($NAD_POLICY_DIR)"
		POLICY=$policy
		write_config
		continue
	fi
	if [ "$(hash_of "$PUBLISHED_PATH")" != "$PUBLISHED_HASH" ]; then
		log "$PUBLISHED_PATH was changed or removed by someone else; restoring it"
		write_config
	fi
done
