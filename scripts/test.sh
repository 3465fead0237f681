#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian 12 machine: installs the real
# peers the end-to-end tests use (DPDK testpmd with the memif driver, the
# host-local IPAM plugin, podman and runc, QEMU and a static busybox for the
# guests the vhost-user tests boot, Prometheus, kubernetes-validate), checks formatting
# and clippy, holds the hot path to its instruction budget, runs the fuzz
# targets briefly, then `cargo test` over the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
[ -x /usr/bin/dpdk-testpmd ] || need_pkgs+=(dpdk dpdk-dev)
ls /usr/lib/x86_64-linux-gnu/dpdk/pmds-*/librte_net_memif.so* >/dev/null 2>&1 \
  || ls /usr/lib/*/librte_net_memif.so* >/dev/null 2>&1 \
  || need_pkgs+=(librte-net-memif23)
command -v stdbuf >/dev/null || need_pkgs+=(coreutils)
# Uplink tests make network namespaces, veth pairs and taps; af-xdp ports
# open libxdp (and its XDP programs) at run time.
command -v ip >/dev/null || need_pkgs+=(iproute2)
ls /usr/lib/*/libxdp.so.1 >/dev/null 2>&1 || need_pkgs+=(libxdp1)
# ethtool reads the features an af-xdp port turns off on its interface.
command -v ethtool >/dev/null || need_pkgs+=(ethtool)
# The CNI tests delegate IPAM to the real host-local plugin.
[ -x /usr/lib/cni/host-local ] || need_pkgs+=(containernetworking-plugins)
# A real container runtime runs the plugin (podman's CNI backend, runc).
command -v podman >/dev/null || need_pkgs+=(podman)
command -v runc >/dev/null || need_pkgs+=(runc)
# `kubectl kustomize` builds what `kubectl apply -k config/kubernetes` applies.
command -v kubectl >/dev/null || need_pkgs+=(kubernetes-client)
# The webhook tests post AdmissionReviews with curl and make certificates
# with the set-up script (openssl).
command -v curl >/dev/null || need_pkgs+=(curl)
command -v openssl >/dev/null || need_pkgs+=(openssl)
# QEMU guests on vhost-user ports: QEMU itself (without the GUI and
# firmware extras it recommends) and the static busybox the test's
# initramfs is made of. The test fetches the guest kernel package itself
# (apt-get download linux-image-cloud-amd64's kernel).
no_recommends=()
# The metrics test has a real Prometheus server scrape the switch.
command -v prometheus >/dev/null || no_recommends+=(prometheus)
# tcpdump reads the captures the observe test writes and the VLAN tags on
# the uplink tests' wire.
command -v tcpdump >/dev/null || need_pkgs+=(tcpdump)
# TCP through the switch with the kernel's offloads on: iperf3, ethtool
# (the stations' offloads), a file transfer in python3.
command -v iperf3 >/dev/null || need_pkgs+=(iperf3)
command -v ethtool >/dev/null || need_pkgs+=(ethtool)
command -v python3 >/dev/null || need_pkgs+=(python3)
# The instruction budget of the hot path runs its benches under callgrind.
command -v valgrind >/dev/null || need_pkgs+=(valgrind)
# Open vSwitch (userspace datapath) is the VLAN-aware top-of-rack switch
# between the uplink tests' nodes: trunk ports, access-port stations.
command -v ovs-vswitchd >/dev/null || no_recommends+=(openvswitch-switch)
command -v qemu-system-x86_64 >/dev/null || no_recommends+=(qemu-system-x86)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "ok installed" \
  || no_recommends+=(busybox-static)
# ... which needs the package lists.
need_update=0
apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1 || need_update=1
if [ $((${#need_pkgs[@]} + ${#no_recommends[@]} + need_update)) -gt 0 ]; then
  echo "installing ${need_pkgs[*]} ${no_recommends[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q </dev/null
  [ ${#need_pkgs[@]} -eq 0 ] || $SUDO apt-get install -y -q "${need_pkgs[@]}" </dev/null
  [ ${#no_recommends[@]} -eq 0 ] \
    || $SUDO apt-get install -y -q --no-install-recommends "${no_recommends[@]}" </dev/null
fi

# The manifest test validates config/kubernetes/ against the Kubernetes
# schemas with the kubernetes-validate package (PyPI).
if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
  echo "installing kubernetes-validate" >&2
  python3 -m pip --version >/dev/null 2>&1 || {
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-pip </dev/null
  }
  python3 -m pip install -q kubernetes-validate </dev/null \
    || python3 -m pip install -q --break-system-packages kubernetes-validate </dev/null
fi

# CI builds everything once, from a clean clone: incremental compilation's
# bookkeeping would only cost there.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi

# The code stays formatted and lint-clean (clippy with the workspace lints:
# every unsafe block documents why it holds).
for c in rustfmt clippy; do
  cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1 || rustup component add "$c" </dev/null
done
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings </dev/null
# The fuzz crate is outside the workspace (cargo-fuzz's flags): the same
# checks there, in the workspace's target directory, whose checked
# dependencies it shares.
(cd fuzz && cargo fmt --check \
  && CARGO_TARGET_DIR=../target cargo clippy --all-targets --locked -- -D warnings </dev/null)

# The hot path within its instruction budget (benches/budget.toml):
# callgrind's instructions per frame, which the VM's drifting speed cannot
# blur, from a release build of the hot-path benches.
./benches/callgrind_budget.py

# Every fuzz target for a bounded time on the corpus kept in fuzz/corpus
# (every stored input replayed, then 10 s of new ones per target, two
# targets at a time: CI's share; scripts/fuzz.sh SECONDS fuzzes longer).
./scripts/fuzz.sh "${FUZZ_SECONDS:-10}"

# Runs `cargo test "$@"` once per filter of $filters, each on its own, and
# prints how many tests it ran: a filter that runs none (its module moved or
# was renamed) fails the script, as does a failing test.
filtered() {
  local f out n
  for f in "${filters[@]}"; do
    out="$(cargo test "$@" -- "$f" </dev/null 2>&1)" || { printf '%s\n' "$out"; return 1; }
    n="$(printf '%s\n' "$out" | sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' | awk '{s += $1} END {print s + 0}')"
    echo "filter $f: $n tests passed"
    if [ "$n" -eq 0 ]; then
      echo "filter $f ran no test" >&2
      return 1
    fi
  done
}

# The unit tests of the code that reads peer memory and builds frames
# (queues, frames, wire formats, the forwarder, the transmit slots) under
# AddressSanitizer: an out-of-bounds or freed access in their unsafe code
# fails the run. Miri needs a nightly toolchain this machine cannot fetch;
# the stable toolchain ships the sanitizer runtimes. The SIGBUS module's
# tests are left out: ASan owns SIGBUS.
filters=(queue:: wire:: port::memif::queue port::vhost_user::queue port::memif::region
  forward::tests port::vxlan::queues dataplane::slots::tests)
(
  export RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=target/asan
  filtered -p switchyard --lib --target x86_64-unknown-linux-gnu --locked
)

cargo test --workspace --locked "$@" </dev/null
