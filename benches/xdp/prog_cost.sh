#!/usr/bin/env bash
# The cost of an af-xdp port's XDP program, per frame, as the kernel counts
# it (kernel.bpf_stats_enabled: run_time_ns / run_cnt in the program's
# fdinfo): a DPDK testpmd (txonly, net_af_packet) floods 64-byte frames,
# untagged or tagged with VLAN_ID, through a Linux bridge into the veth an
# af-xdp trunk port owns. The bridge moves each tag beside the data, so a
# tagged run measures the program putting it back.
#
#   benches/xdp/prog_cost.sh SWITCHYARD_BINARY [VLAN_ID|0] [SECONDS]
#
# Compare builds by running each in turn in one session (the VM's speed
# drifts). Needs root, dpdk-testpmd and the af-xdp port's needs.
set -euo pipefail
BIN=$(realpath "$1"); VLAN=${2:-0}; SECS=${3:-5}
NS=sy-xdpcost-$$
D=$(mktemp -d)
SW=
cleanup() {
  [ -z "$SW" ] || { kill "$SW" 2>/dev/null; wait "$SW" 2>/dev/null || true; }
  sysctl -qw kernel.bpf_stats_enabled=0
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT
ip netns add "$NS"
ip -n "$NS" link add g0 type veth peer name g1
ip -n "$NS" link add s0 type veth peer name s1
ip -n "$NS" link add br0 type bridge
for i in g0 g1 s0 s1 br0; do ip -n "$NS" link set "$i" up; done
ip -n "$NS" link set g1 master br0
ip -n "$NS" link set s1 master br0
cat > "$D/switchyard.toml" <<EOT
control_socket = "$D/control.sock"
state_dir = "$D/state"
socket_dir = "$D"
[[bridge]]
name = "default"
EOT
ip netns exec "$NS" "$BIN" run --config "$D/switchyard.toml" > "$D/switchyard.log" 2>&1 &
SW=$!
for _ in $(seq 100); do
  "$BIN" --control "$D/control.sock" bridge list >/dev/null 2>&1 && break
  sleep 0.1
done
"$BIN" --control "$D/control.sock" port add up --kind af-xdp --interface s0 \
  --trunk all --bridge default
sysctl -qw kernel.bpf_stats_enabled=1
: > "$D/cmds"
if [ "$VLAN" != 0 ]; then
  printf 'port stop 0\ntx_vlan set 0 %s\nport start 0\n' "$VLAN" >> "$D/cmds"
fi
echo start >> "$D/cmds"
(sleep "$SECS"; echo stop; echo quit) | ip netns exec "$NS" dpdk-testpmd -l 0,1 \
  --no-pci --no-huge -m 1024 --file-prefix "$NS" --vdev=net_af_packet0,iface=g0 \
  -- -i --total-num-mbufs=8192 --forward-mode=txonly --cmdline-file="$D/cmds" \
  > "$D/testpmd.log" 2>&1
for f in /proc/"$SW"/fdinfo/*; do
  grep -q '^prog_type:' "$f" 2>/dev/null || continue
  awk -v vlan="$VLAN" '/^run_time_ns:/ {t=$2} /^run_cnt:/ {n=$2}
    END {if (n) printf "vlan %s: %.1f ns a frame over %d frames\n", vlan, t/n, n}' "$f"
  break
done
"$BIN" --control "$D/control.sock" stats up | sed -n 2p
