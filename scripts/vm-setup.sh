#!/usr/bin/env bash
# Install what the SR-IOV VM tier (e2e/tests/vm_sriov) needs, as root on Debian 12:
#   - QEMU 8.0+ for the emulated Intel 82576 (`-device igb`): Debian 12 has 7.2, so
#     qemu-system-x86 comes from bookworm-backports (added to apt's sources if missing);
#   - busybox-static for the initramfs (its `nc` also relays the guest's apiserver connections);
#   - pci.ids, the PCI database the SR-IOV device plugin (sriovdp) needs in the node cases;
#   - Debian's kernel package, downloaded and unpacked into target/vm (scripts/vm-kernel.sh;
#     never installed).
# Everything is --no-install-recommends and idempotent. scripts/setup.sh runs it when
# PLEXUS_SETUP_VM=1 (scripts/test.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

qemu_has_igb() {
  command -v qemu-system-x86_64 >/dev/null 2>&1 &&
    qemu-system-x86_64 -device help 2>/dev/null | grep -q '"igb"'
}

need=()
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" ||
  need+=(busybox-static)
dpkg-query -W -f='${Status}' pci.ids 2>/dev/null | grep -q "install ok installed" ||
  need+=(pci.ids)
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! qemu_has_igb; then
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  if [ "$codename" = bookworm ] &&
    ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "deb http://deb.debian.org/debian bookworm-backports main" \
      >/etc/apt/sources.list.d/bookworm-backports.list
  fi
  apt-get update -qq
  if [ "$codename" = bookworm ]; then
    apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
  else
    apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
  fi
  qemu_has_igb || { echo "vm-setup: installed QEMU cannot emulate igb" >&2; exit 1; }
fi

bash scripts/vm-kernel.sh
