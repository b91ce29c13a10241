#!/usr/bin/env bash
# More than one machine: two "hosts" made of two network namespaces joined by a veth pair
# (10.77.0.1 and 10.77.0.2), the launcher in each (--nnodes=2 --node_rank=K
# --nproc_per_node=2 --master_addr=10.77.0.1), Gloo on the CPU over the veth
# (GLOO_SOCKET_IFNAME), one output_dir that both hosts see (a shared file system).
#  a. A 2 x 2 job's losses equal a 1 x 4 job's (the same global batches), DDP and FSDP2.
#  b. The same with 100 ms of netem delay on the link (SKIPPED where the kernel has no netem).
#  c. The link cut once FSDP2 training is under way: both launchers exit non-zero within
#     ddp_timeout plus the grace period, with an error naming the timeout or the lost peer, and
#     the newest checkpoint saved before the cut resumes on one node with 2 processes,
#     continuing the uninterrupted 1 x 4 run's losses.
# Needs root and iproute2 (ip); without them every part is printed SKIPPED with the reason.
set -uo pipefail
launch="$1"
program="$2"
source "$(dirname "$0")/variants.sh"
tmp=$TEST_TMPDIR
steps=10       # a and b
cut_steps=60   # c: the run must still be going when the link is cut (about 3 s after step 3)
timeout_s=10   # c: ddp_timeout
grace_s=5      # the launchers' --grace_period_s
port=29500     # the namespaces are this run's own, so the port is free in them
ns=("cpt_mn$$_0" "cpt_mn$$_1")  # unique per run: parallel runs do not collide
dev=(mn0 mn1)                   # the veth ends, created inside the namespaces
addr=(10.77.0.1 10.77.0.2)
parts=("ddp 2 x 2 = 1 x 4" "fsdp 2 x 2 = 1 x 4" "netem delay" "netem delay" "link cut"
       "resume after the cut")

cleanup() {  # ends what runs in the namespaces (only this run's processes), then removes them
  local n pid
  for n in "${ns[@]}"; do
    for pid in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$n" 2>/dev/null
  done
}

make_hosts() {  # prints why not on failure
  local k
  ip netns add "${ns[0]}" 2>&1 && ip netns add "${ns[1]}" 2>&1 &&
    ip link add "${dev[0]}" netns "${ns[0]}" type veth \
      peer name "${dev[1]}" netns "${ns[1]}" 2>&1 || return 1
  for k in 0 1; do
    ip -n "${ns[$k]}" addr add "${addr[$k]}/24" dev "${dev[$k]}" 2>&1 &&
      ip -n "${ns[$k]}" link set "${dev[$k]}" up 2>&1 &&
      ip -n "${ns[$k]}" link set lo up 2>&1 || return 1
  done
}

node() {  # node rank, log, program flags...: this node's launcher, in its namespace
  local k=$1 log=$2
  shift 2
  GLOO_SOCKET_IFNAME=${dev[$k]} timeout 300 ip netns exec "${ns[$k]}" "$launch" --nnodes=2 \
    --node_rank="$k" --nproc_per_node=2 --master_addr="${addr[0]}" --master_port=$port \
    --grace_period_s=$grace_s "$program" --use_cpu "$@" > "$log" 2>&1
}

two_nodes() {  # name, program flags...: a 2 x 2 job; sets code0 and code1
  local name=$1 p0 p1
  shift
  node 0 "$tmp/$name.0.log" --output_dir="$tmp/$name" "$@" &
  p0=$!
  node 1 "$tmp/$name.1.log" --output_dir="$tmp/$name" "$@" &
  p1=$!
  wait $p0
  code0=$?
  wait $p1
  code1=$?
  grep -o "LOSS .*" "$tmp/$name.0.log" > "$tmp/$name.losses"  # rank 0 is on node 0
}

one_node() {  # name, processes, program flags...: on this machine's loopback
  local name=$1 n=$2
  shift 2
  timeout 300 "$launch" --nproc_per_node="$n" --master_port=0 "$program" --use_cpu \
    --output_dir="$tmp/$name" "$@" > "$tmp/$name.log" 2>&1
  local code=$?
  [[ $code -eq 0 ]] || { tail -20 "$tmp/$name.log"; echo "FAIL: $name exited $code"; }
  grep -o "LOSS .*" "$tmp/$name.log" > "$tmp/$name.losses"
  return $code
}

# Checks that losses hold steps first..last once each, within a relative tolerance of the
# reference's; prints the largest relative difference.
compare() {  # name, reference losses, losses, tolerance, first step, last step
  awk -v name="$1" -v tol="$4" -v first="$5" -v last="$6" '
    NR == FNR { want[$2] = $3; next }
    { if ($2 != first + seen) {
        print name ": step " $2 " where step " first + seen " was due"; bad = 1 }
      seen++
      if (!($2 in want)) { print name ": step " $2 " is not in the reference"; bad = 1; next }
      d = $3 - want[$2]; if (d < 0) d = -d; r = d / want[$2]; if (r > worst) worst = r
      if (r > tol) {
        printf "%s: step %d: loss %.17g, reference %.17g\n", name, $2, $3, want[$2]; bad = 1 } }
    END { if (seen != last - first + 1) {
            printf "%s: %d losses, expected steps %d-%d\n", name, seen, first, last; bad = 1 }
          printf "%s: steps %d-%d, max relative loss difference %.3g (tolerance %g)\n",
                 name, first, last, worst, tol
          exit bad }' "$2" "$3"
}

errors() {  # log: the launcher's lines and the ranks' error lines, without glog headers
  grep -E "launch:|failed|Error|error" "$1" |
    sed 's/^\(\[rank [0-9]*\]\) [IWE][0-9 :.]*[a-z_]*\.cc:[0-9]*\]/\1/' | head -8
}

why=""
if [[ $(id -u) -ne 0 ]]; then
  why="network namespaces need root (running as uid $(id -u))"
elif ! command -v ip > /dev/null; then
  why="ip (iproute2) is not installed"
fi
if [[ -z "$why" ]]; then
  trap cleanup EXIT
  why=$(make_hosts) || why="cannot make the two hosts: ${why:-ip failed}"
  [[ -n "$why" ]] && why=${why//$'\n'/ }
fi
if [[ -n "$why" ]]; then
  for part in "${parts[@]}"; do skip "$part" "$why"; done
  variants_done
  exit
fi
echo "hosts: ${ns[0]} (${dev[0]} ${addr[0]}) and ${ns[1]} (${dev[1]} ${addr[1]}), one veth pair"
start=$SECONDS

# a. The same job on two nodes and on one.
for engine in ddp fsdp; do
  one_node "${engine}_1x4" 4 --engine=$engine --max_steps=$steps
  ref=$?
  two_nodes "${engine}_2x2" --engine=$engine --max_steps=$steps
  echo "== $engine: 2 nodes x 2 processes over ${dev[0]}-${dev[1]}: exit $code0 and $code1"
  ok=0
  if [[ $ref -ne 0 || $code0 -ne 0 || $code1 -ne 0 ]]; then
    tail -15 "$tmp/${engine}_2x2.0.log" "$tmp/${engine}_2x2.1.log"; ok=1
  fi
  compare "$engine 2x2 vs 1x4" "$tmp/${engine}_1x4.losses" "$tmp/${engine}_2x2.losses" \
    1e-6 1 $steps || ok=1
  record 4 $ok cpu
done

# b. 100 ms more on every packet node 1 sends.
if netem=$(ip netns exec "${ns[1]}" tc qdisc add dev "${dev[1]}" root netem delay 100ms 2>&1); then
  for engine in ddp fsdp; do
    t0=$SECONDS
    two_nodes "${engine}_netem" --engine=$engine --max_steps=$steps
    echo "== $engine with 100 ms netem delay: exit $code0 and $code1 after $((SECONDS - t0)) s"
    ok=0
    if [[ $code0 -ne 0 || $code1 -ne 0 ]]; then
      tail -15 "$tmp/${engine}_netem.0.log" "$tmp/${engine}_netem.1.log"; ok=1
    fi
    compare "$engine 2x2 delayed vs 1x4" "$tmp/${engine}_1x4.losses" \
      "$tmp/${engine}_netem.losses" 1e-6 1 $steps || ok=1
    record 4 $ok cpu
  done
  ip netns exec "${ns[1]}" tc qdisc del dev "${dev[1]}" root
else
  skip "netem delay" "${netem//$'\n'/ } (ddp)"
  skip "netem delay" "${netem//$'\n'/ } (fsdp)"
fi

# c. The link cut once training is under way.
one_node fsdp_long_1x4 4 --engine=fsdp --max_steps=$cut_steps
ref=$?
for k in 0 1; do
  ( node $k "$tmp/cut.$k.log" --output_dir="$tmp/cut" --engine=fsdp --max_steps=$cut_steps \
      --ddp_timeout_s=$timeout_s
    echo "$? $(date +%s.%N)" > "$tmp/cut.$k.end" ) &
done
ok=1
for _ in $(seq 1200); do
  grep -q '"step":3}' "$tmp/cut.0.log" 2>/dev/null && { ok=0; break; }
  sleep 0.05
done
cut_at=$(date +%s.%N)
ip -n "${ns[1]}" link set "${dev[1]}" down
wait
(( ok )) && echo "FAIL: training on the two nodes did not reach step 3 within 60 s"
limit=$((timeout_s + grace_s))
for k in 0 1; do
  read -r code end < "$tmp/cut.$k.end"
  after=$(awk -v a="$cut_at" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  echo "== link cut: node $k's launcher exited $code ${after} s after the cut" \
    "(ddp_timeout $timeout_s s + grace period $grace_s s = $limit s)"
  errors "$tmp/cut.$k.log"
  if [[ $code -eq 0 || $code -eq 124 ]]; then
    echo "FAIL: node $k's launcher should fail after the cut (exit $code$([[ $code -eq 0 ]] &&
      echo ": training ended before the cut"))"; ok=1
  fi
  if awk -v t="$after" -v limit=$limit 'BEGIN { exit !(t > limit) }'; then
    echo "FAIL: node $k's launcher took ${after} s, more than $limit s"; ok=1
  fi
  if ! grep -qiE "^\[rank [0-9]\].*(timed out|timeout|10\.77\.0\.[12])" "$tmp/cut.$k.log"; then
    echo "FAIL: no rank on node $k named the timeout or the lost peer"; ok=1
  fi
done
trained=$(grep -o '"step":[0-9]*}' "$tmp/cut.0.log" | tail -1 | tr -dc 0-9)
echo "steps logged before the cut ended the run: ${trained:-none}"
record 4 $ok cpu

# The newest checkpoint the cut run committed loads on one node with 2 processes and continues
# the uninterrupted run.
ls -a "$tmp/cut"
latest=$(ls -d "$tmp/cut/checkpoint-"* 2>/dev/null | sort -V | tail -1)
saved=${latest##*-}
ok=0
if [[ -z "$latest" || $saved -lt 2 ]]; then
  echo "FAIL: the cut run left no checkpoint"; ok=1
else
  one_node cut_resumed 2 --engine=fsdp --max_steps=$cut_steps --resume="$latest" || ok=1
  echo "== resumed $latest on one node, 2 processes"
  compare "resumed after the cut vs 1x4" "$tmp/fsdp_long_1x4.losses" "$tmp/cut_resumed.losses" \
    1e-5 $((saved + 1)) $cut_steps || ok=1
fi
[[ $ref -eq 0 ]] || ok=1
record 2 $ok cpu
echo "wall time in the namespaces and references: $((SECONDS - start)) s"
variants_done
