#!/usr/bin/env bash
# Re-measures configurations found by `deepio tune` side by side: interleaved rounds (A B C A
# B C ...) of ds_io runs, read and write, and prints each configuration's median E2E GiB/s.
# Shared machines drift from run to run, so the winners of two tune runs are only comparable
# when measured like this.
#   tools/tune_check.sh FOLDER ROUNDS IO_SIZE "BS QD PAR SINGLE OVERLAP" ["..." ...]
#   tools/tune_check.sh /var/tmp 7 400M "1M 128 2 false true" "8M 32 8 false false"
set -euo pipefail
deepio=${DEEPIO_CLI:-deepio}
folder=$1 rounds=$2 io=$3
shift 3
work=$(mktemp -d "$folder/deepio-tune-check-XXXXXX")
trap 'rm -rf "$work"' EXIT
declare -A samples
for ((r = 0; r < rounds; r++)); do
  for cfg in "$@"; do
    read -r bs qd par single overlap <<<"$cfg"
    flags=(--folder "$work" --io_size "$io" --block_size "$bs" --queue_depth "$qd" --io_parallel "$par" --loops 1)
    [[ $single == true ]] && flags+=(--single_submit)
    [[ $overlap == false ]] && flags+=(--sequential_requests)
    for op in read write; do
      extra=(); [[ $op == read ]] && extra=(--read)
      v=$("$deepio" bench "${flags[@]}" "${extra[@]}" | sed -n "s/^E2E .* Speed = \(.*\) GB\/sec$/\1/p")
      samples["$cfg|$op"]+="$v "
    done
  done
done
printf '%-26s %12s %12s %12s\n' "config (bs qd par ss ov)" "read GiB/s" "write GiB/s" "sum"
for cfg in "$@"; do
  med() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
  r=$(med "${samples[$cfg|read]}"); w=$(med "${samples[$cfg|write]}")
  printf '%-26s %12.2f %12.2f %12.2f\n' "$cfg" "$r" "$w" "$(echo "$r + $w" | bc -l)"
done
