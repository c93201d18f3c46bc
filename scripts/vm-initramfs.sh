#!/usr/bin/env bash
# Build the initramfs of the SR-IOV VM tier: busybox, the kernel modules the tier needs (with
# their dependencies, in load order) and an /init that mounts the host's root read-only over 9p,
# chroots into it and runs one command (the in-VM test runner), then powers off.
#
# Usage: scripts/vm-initramfs.sh KERNEL_TREE OUT.cpio.gz
#   KERNEL_TREE: an unpacked linux-image package (scripts/vm-kernel.sh makes target/vm/kernel)
#
# The kernel command line tells /init what to run: plexus.run=<absolute path in the host root>,
# plexus.out=<host directory shared writable as mount tag "out">, plexus.args=<one argument>,
# plexus.cases=<comma-separated case-name filters, passed on as PLEXUS_VM_CASES>,
# plexus.peer=<the second node's VF address, passed on as PLEXUS_VM_PEER>,
# plexus.peernode=1 when the second node runs a kubelet (PLEXUS_VM_PEER_NODE).
set -euo pipefail
tree="$(readlink -f "$1")"
out="$2"
ver="$(ls "$tree/lib/modules" | head -n1)"
moddir="$tree/lib/modules/$ver"
busybox="$(command -v busybox)"
file "$busybox" 2>/dev/null | grep -q 'dynamically' &&
  { echo "vm-initramfs: $busybox is dynamic; install busybox-static" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{bin,dev,proc,sys,host,modules}
cp "$busybox" "$work/bin/busybox"
for a in sh mount umount insmod mkdir chroot cat poweroff sleep echo ls dmesg; do
  ln -s busybox "$work/bin/$a"
done

# Root modules: the emulated 82576 PF and its VFs, the 9p share of the host root, vfio-pci for
# DPDK mode, and what the CNI plugins used by plexus' default network need (veth, bridge).
# The node cases (a kubelet + containerd in the VM) add: virtio_net (the node's own NIC, the
# apiserver through QEMU's guestfwd), overlay (containerd's snapshotter), vxlan (flannel),
# br_netfilter, 8021q, crc32c_generic (libcrc32c soft-depends on it), and nf_tables + the xt matches iptables-nft uses (flannel, portmap).
# The far end of the wire (a second igb PF) counts tagged frames with tc: sch_ingress, cls_flower, act_gact.
roots=(virtio_pci 9pnet_virtio 9p igb igbvf vfio-pci vfio_iommu_type1 veth bridge
  virtio_net overlay vxlan br_netfilter 8021q crc32c_generic libcrc32c nf_tables nft_compat nft_chain_nat nft_nat
  nft_masq nft_ct nft_reject_inet nft_fib_inet nf_conntrack nf_nat xt_MASQUERADE xt_conntrack
  xt_comment xt_mark xt_addrtype xt_multiport xt_nat xt_statistic xt_tcpudp
  sch_ingress cls_flower act_gact)
declare -A seen=()
order=()
find_mod() {
  local n="$1" alt="${1//_/-}" alt2="${1//-/_}"
  find "$moddir/kernel" \( -name "$n.ko" -o -name "$alt.ko" -o -name "$alt2.ko" \) | head -n1
}
resolve() {
  local f deps d
  f="$(find_mod "$1")"
  [ -n "$f" ] || { echo "vm-initramfs: module $1 not in $moddir (built in?)" >&2; return 0; }
  [ -z "${seen[$f]:-}" ] || return 0
  seen[$f]=1
  # The .modinfo strings are NUL-separated "key=value" pairs.
  deps="$(tr '\0' '\n' <"$f" | sed -n 's/^depends=//p' | head -n1 | tr ',' ' ')"
  for d in $deps; do resolve "$d"; done
  order+=("$f")
}
for m in "${roots[@]}"; do resolve "$m"; done
: >"$work/modules/order"
for f in "${order[@]}"; do
  cp "$f" "$work/modules/"
  basename "$f" >>"$work/modules/order"
done

cat >"$work/init" <<'EOF'
#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do
  insmod "/modules/$m" || echo "vm-init: insmod $m failed"
done
arg() { for w in $(cat /proc/cmdline); do case "$w" in "$1="*) echo "${w#*=}";; esac; done; }
run="$(arg plexus.run)"
outdir="$(arg plexus.out)"
args="$(arg plexus.args)"
cases="$(arg plexus.cases)"
peer="$(arg plexus.peer)"
peernode="$(arg plexus.peernode)"
o=trans=virtio,version=9p2000.L,msize=512000
if ! mount -t 9p -o "$o,cache=loose,ro" hostroot /host; then
  echo "vm-init: cannot mount the host root over 9p"; poweroff -f
fi
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
# The guest's writable directories, whether or not the host has them (a machine that never ran
# a node has no /var/lib/kubelet nor /var/lib/cni, and the 9p root is read-only):
#  1. each one the host lacks is created on a writable layer: where an ancestor is already
#     writable (made so by an earlier step) a plain mkdir; else an overlay over its deepest
#     existing ancestor, the host's directory the read-only lower layer and a tmpfs the upper,
#     so that directory's other entries (/var/lib/dpkg, …) stay visible as they are;
#  2. then every one gets a tmpfs of its own: empty, whatever the host keeps there (a host
#     kubelet's state must not leak into the guest's node).
# The host directories the run needs (plexus.keep: the checkout and the target directory) stay
# the host's own wherever they are: bound aside first, back on top after.
writable="/run /tmp /var/tmp /var/lib/cni /var/lib/kubelet /var/log"
keep="$(arg plexus.keep)"
n=0
IFS=,
for k in $keep; do
  [ -d "/host$k" ] || continue
  mkdir -p "/keep/$n" && mount -o bind "/host$k" "/keep/$n" && echo "$k" >"/keep/$n.path"
  n=$((n + 1))
done
unset IFS
ov=0
for d in $writable; do
  [ -d "/host$d" ] && continue
  mkdir -p "/host$d" 2>/dev/null && continue
  a="${d%/*}"
  while [ -n "$a" ] && [ ! -d "/host$a" ]; do a="${a%/*}"; done
  [ -n "$a" ] || { echo "vm-init: no ancestor of $d to lay an overlay on"; continue; }
  u="/overlay/$ov"
  ov=$((ov + 1))
  mkdir -p "$u" && mount -t tmpfs tmpfs "$u" && mkdir -p "$u/upper" "$u/work" &&
    mount -t overlay overlay -o "lowerdir=/host$a,upperdir=$u/upper,workdir=$u/work" "/host$a" &&
    mkdir -p "/host$d" || echo "vm-init: cannot make $d writable (overlay on $a)"
done
for d in $writable; do
  mount -t tmpfs tmpfs "/host$d" || echo "vm-init: no tmpfs on $d"
done
for f in /keep/*.path; do
  [ -f "$f" ] || continue
  k="$(cat "$f")"
  mkdir -p "/host$k" && mount -o bind "${f%.path}" "/host$k" || echo "vm-init: cannot keep $k visible"
done
# The node cases' kubelet and containerd: cgroup v2 (the guest's own hierarchy).
mount -t cgroup2 cgroup2 /host/sys/fs/cgroup 2>/dev/null || echo "vm-init: no cgroup2"
# After the tmpfs mounts: the out directory may live under /tmp (created on the tmpfs then).
mkdir -p "/host$outdir" 2>/dev/null
mount -t 9p -o "$o" out "/host$outdir" || echo "vm-init: cannot mount the out share"
echo "vm-init: running $run $args"
chroot /host /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root PLEXUS_VM_OUT="$outdir" PLEXUS_VM_CASES="$cases" PLEXUS_VM_PEER="$peer" \
  PLEXUS_VM_PEER_NODE="$peernode" "$run" $args
echo "$?" >"/host$outdir/exit-code"
echo "vm-init: done"
umount "/host$outdir"
poweroff -f
EOF
chmod +x "$work/init"
(cd "$work" && find . | "$busybox" cpio -o -H newc 2>/dev/null) | gzip -1 >"$out.tmp"
mv "$out.tmp" "$out"
echo "vm-initramfs: $out (kernel $ver, ${#order[@]} modules)"
