#!/bin/sh
# mpirun launches this once per rank: rank r runs inside network namespace <prefix>-r, so its
# only interface (besides lo) is that namespace's shaped veth. Needs root (ip netns exec).
exec ip netns exec "${DPCOMM_NS_PREFIX:-dpcomm}-${OMPI_COMM_WORLD_RANK:?run me under Open MPI mpirun}" "$@"
