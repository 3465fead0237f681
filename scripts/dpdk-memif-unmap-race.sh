#!/bin/bash
# Reproduces, without Switchyard, the DPDK memif crash our tests work around.
#
# DPDK's memif driver (22.11 here, unchanged in main) ends a connection in its
# interrupt thread: memif_disconnect (drivers/net/memif/memif_socket.c) clears
# ETH_MEMIF_FLAG_CONNECTED and then munmaps the regions (memif_free_regions),
# with no synchronisation with the forwarding lcore, which tests the flag at
# the top of eth_memif_rx/eth_memif_tx (rte_eth_memif.c) and then reads the
# rings in those regions. An lcore that tested the flag before it was cleared
# and is preempted until after the munmap reads unmapped memory: SIGSEGV.
#
# The pod: testpmd with two memif servers, forwarding between them (io). Its
# peer: a second testpmd, memif client on both sockets, also forwarding. The
# peer is killed (SIGKILL) under traffic, and the pod is checked.
#   scripts/dpdk-memif-unmap-race.sh [RUNS]          the pod polls: it dies in some runs
#   scripts/dpdk-memif-unmap-race.sh [RUNS] pause    the pod stops forwarding
#                                                    ("stop") first: it survives
# Exit status 1 if the pod died in any run.
set -u
runs=${1:-20}
pause=${2:-}
testpmd=${TESTPMD:-dpdk-testpmd}
dir=$(mktemp -d /tmp/memif-race.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$dir" /var/run/dpdk/memif-race-$$-*
}
trap cleanup EXIT

eal() { # file prefix
    echo --no-huge -m 256 --no-pci --file-prefix "memif-race-$$-$1" --lcores 0@0,1@1
}
vdevs() { # role
    for p in 0 1; do
        echo "--vdev=net_memif$p,role=$1,id=0,socket=$dir/m$p.sock,socket-abstract=no"
    done
}
wait_for() { # seconds, command...
    local end=$((SECONDS + $1)); shift
    until "$@"; do
        [ $SECONDS -ge $end ] && return 1
        sleep 0.1
    done
}

died=0
for i in $(seq 1 "$runs"); do
    rm -f "$dir"/*.sock "$dir/in"
    mkfifo "$dir/in"
    # shellcheck disable=SC2046
    "$testpmd" $(eal pod-$i) $(vdevs server) -- -i --total-num-mbufs=8192 \
        --forward-mode=io <"$dir/in" >"$dir/pod.log" 2>&1 &
    pod=$!
    pids+=("$pod")
    exec 7>"$dir/in"
    echo "start tx_first" >&7
    wait_for 20 test -S "$dir/m1.sock" || { echo "the pod did not listen"; exit 2; }
    # shellcheck disable=SC2046
    "$testpmd" $(eal peer-$i) $(vdevs client) -- --total-num-mbufs=8192 \
        --forward-mode=io -a --tx-first --stats-period 1 >"$dir/peer.log" 2>&1 &
    peer=$!
    pids+=("$peer")
    sleep 4
    if [ -n "$pause" ]; then
        echo stop >&7
        wait_for 10 grep -q "Accumulated forward statistics" "$dir/pod.log"
    fi
    kill -9 "$peer"
    wait "$peer" 2>/dev/null
    sleep 2
    if kill -0 "$pod" 2>/dev/null; then
        echo quit >&7
        wait "$pod"
        echo "run $i: the pod survived"
    else
        wait "$pod"
        echo "run $i: the pod died (exit status $?)"
        died=$((died + 1))
    fi
    exec 7>&-
    rm -rf /var/run/dpdk/memif-race-$$-*
done
echo "the pod died in $died of $runs runs${pause:+ (paused first)}"
[ "$died" = 0 ]
