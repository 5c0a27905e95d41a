#!/usr/bin/env bash
# Runs bench_comm on 4 MPI ranks over a bandwidth-limited network that this script builds and
# removes again: 4 network namespaces ("nodes"), each with one veth into a hub namespace where
# a bridge joins them (a switch). tc tbf limits every veth in both directions (node egress on
# the node side, node ingress on the hub side), i.e. each node has a full-duplex NIC of RATE.
# MPI is forced onto TCP over those veths (pml ob1, btl tcp,self; no shared memory).
# mpirun itself runs in node 0's namespace; its PMIx server (Open MPI 4 / PMIx 3+ talks to its
# clients over TCP) is told to accept connections on the node subnet, so ranks in the other
# namespaces can reach it (a few KiB at start-up, over the same shaped links).
#
# Addresses: only 10.231.7.1-4/24 inside the namespaces; nothing is created or changed in the
# root namespace. Needs root, iproute2 (ip, tc) and the bridge and sch_tbf kernel modules.
#
#   sudo bench/comm/shaped_network.sh BUILD_DIR [RATE ...] [-- bench_comm args]
#   e.g.  bench/comm/shaped_network.sh build/default 1gbit 10gbit -- --min-log2 20 --max-log2 26
#
# Environment: NP (4), PREFIX (dpcomm), JSON (file to append JSON lines to), MPIRUN (mpirun).
set -euo pipefail

build=${1:?usage: shaped_network.sh BUILD_DIR [RATE ...] [-- bench_comm args]}
shift
rates=()
while (($#)) && [[ $1 != -- ]]; do rates+=("$1"); shift; done
(($#)) && shift
((${#rates[@]})) || rates=(1gbit 10gbit)
bench_args=("$@")

np=${NP:-4}
prefix=${PREFIX:-dpcomm}
subnet=10.231.7
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/bench/comm/bench_comm
[[ -x $bin ]] || { echo "no $bin (build target bench_comm first)" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root (ip netns)" >&2; exit 1; }

cleanup() {
  for ((i = 0; i < np; ++i)); do ip netns del "$prefix-$i" 2>/dev/null || true; done
  ip netns del "$prefix-hub" 2>/dev/null || true
}
trap cleanup EXIT
cleanup

ip netns add "$prefix-hub"
ip -n "$prefix-hub" link set lo up
ip -n "$prefix-hub" link add br0 type bridge
ip -n "$prefix-hub" link set br0 up
for ((i = 0; i < np; ++i)); do
  ns=$prefix-$i
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$prefix-hub" link add "v$i" type veth peer name eth0 netns "$ns"
  ip -n "$prefix-hub" link set "v$i" master br0 up
  ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
done

shape() {  # tbf on both ends of every veth; burst >= one 64 KiB GSO segment
  local rate=$1 burst=512kb
  for ((i = 0; i < np; ++i)); do
    tc -n "$prefix-$i" qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    tc -n "$prefix-hub" qdisc replace dev "v$i" root tbf rate "$rate" burst "$burst" latency 50ms
  done
}

echo "# machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
echo "# network: $np namespaces ($prefix-0..$((np - 1))) on a bridge, veth MTU $(ip -n "$prefix-0" -o link show eth0 | sed -n 's/.*mtu \([0-9]*\).*/\1/p'), tc tbf per direction"
for rate in "${rates[@]}"; do
  shape "$rate"
  echo "# rate $rate: $(tc -n "$prefix-0" qdisc show dev eth0)"
  cmd=(ip netns exec "$prefix-0" env PMIX_MCA_ptl_tcp_remote_connections=1
       "PMIX_MCA_ptl_tcp_if_include=$subnet.0/24"
       "${MPIRUN:-mpirun}" --allow-run-as-root --oversubscribe -np "$np"
       --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$subnet.0/24"
       -x "DPCOMM_NS_PREFIX=$prefix" -x PMIX_MCA_ptl_tcp_remote_connections -x PMIX_MCA_ptl_tcp_if_include
       "$here/in_netns.sh" "$bin" --label "$rate" ${JSON:+--json "$JSON"} "${bench_args[@]}")
  echo "# command: ${cmd[*]}"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${cmd[@]}"
done
