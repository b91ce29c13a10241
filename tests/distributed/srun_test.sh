#!/usr/bin/env bash
# tools/train under SLURM's srun: a private single-node SLURM (munged, slurmctld and slurmd
# started here as root, their files in a temporary directory, stopped on exit) runs
# `srun -n 2 tools/train` with the demo job for 3 steps on the CPU under DDP (the default
# engine), FSDP2 and ZeRO-3, and `srun -n 3` under DDP. The ranks find each other from srun's
# variables alone (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_TASKS_PER_NODE and the
# node list; no torchrun variable is set), and each run must train as one job of world N with
# the losses tools/launch gives the same engine.
# Needs root (slurmd starts the tasks) and Debian's slurmd, slurmctld, slurm-client and munge
# (tools/install_deps.sh installs them); without them it prints SKIPPED with the reason.
set -uo pipefail
train="$1"
config="$2"
launch="$3"
fail() { echo "FAIL: $1"; [[ -n "${2:-}" ]] && tail -40 "$2"; exit 1; }
skip() { echo "SKIPPED: srun: $1"; echo "srun: 0 runs, 1 skipped"; exit 0; }

[[ $(id -u) -eq 0 ]] || skip "slurmd must run as root to start tasks, and this is uid $(id -u)"
for tool in srun sinfo slurmctld slurmd munged; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (tools/install_deps.sh installs it)"
done

# The daemons' files: a short path, as munge's socket path must fit a socket address.
dir=$(mktemp -d /tmp/cpptrain_slurm.XXXXXX)
stop_daemons() {
  for pid in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munge/pid; do
    [[ -f "$pid" ]] && kill "$(cat "$pid")" 2>/dev/null
  done
  sleep 1
  rm -rf "$dir"
}
trap stop_daemons EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
chmod 700 "$dir/munge"
head -c 1024 /dev/urandom >"$dir/munge/key"
chmod 400 "$dir/munge/key"
munged --force --key-file="$dir/munge/key" --socket="$dir/munge/socket" \
  --pid-file="$dir/munge/pid" --log-file="$dir/munge/log" --seed-file="$dir/munge/seed" ||
  fail "munged did not start" "$dir/munge/log"
host=$(hostname -s)
cat >"$dir/slurm.conf" <<CONF
ClusterName=cpptrain
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=cpptrain Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -c -f "$SLURM_CONF" || fail "slurmctld did not start" "$dir/slurmctld.log"
slurmd -f "$SLURM_CONF" -N "$host" || fail "slurmd did not start" "$dir/slurmd.log"
for _ in $(seq 60); do
  [[ "$(sinfo -h -o %t 2>/dev/null)" == idle ]] && break
  sleep 0.5
done
[[ "$(sinfo -h -o %t 2>/dev/null)" == idle ]] ||
  fail "the node did not become idle: $(sinfo 2>&1 | tr '\n' ' ')" "$dir/slurmd.log"
echo "SLURM $(sinfo -V | cut -d' ' -f2) on $host"

source "$(dirname "$0")/demo_job.sh"

# run ENGINE PROCESSES: tools/launch's run, then srun's, which must match it.
runs=0
run() {
  local engine=$1 n=$2 start=$SECONDS
  local want="$TEST_TMPDIR/launch_${engine}_$n" out="$TEST_TMPDIR/srun_${engine}_$n"
  timeout 300 "$launch" --nproc_per_node="$n" --master_port=0 "$train" "${common[@]}" \
    "$(engine_flag "$engine")" --set="args.output_dir=$want" >/dev/null 2>"$want.log" ||
    fail "tools/launch with $engine on $n processes failed" "$want.log"
  # Only srun's variables: none of torchrun's leaks in from the environment.
  env -u RANK -u LOCAL_RANK -u WORLD_SIZE -u LOCAL_WORLD_SIZE -u MASTER_ADDR \
    MASTER_PORT="$(free_port)" timeout 300 srun -n "$n" --kill-on-bad-exit=1 "$train" \
    "${common[@]}" "$(engine_flag "$engine")" --set="args.output_dir=$out" >"$out.log" 2>&1 ||
    fail "srun -n $n with $engine exited $?" "$out.log"
  grep -q "on cpu, world $n, run $out" "$out.log" ||
    fail "srun -n $n with $engine did not train as one job of world $n" "$out.log"
  local got
  got=$(losses "$out")
  [[ "$(wc -w <<<"$got")" -eq 3 ]] || fail "srun -n $n, $engine: losses '$got', not 3 steps" "$out.log"
  [[ "$got" == "$(losses "$want")" ]] ||
    fail "srun -n $n, $engine: losses $got differ from tools/launch's $(losses "$want")"
  echo "ok   srun -n $n, $engine: losses $got($((SECONDS - start)) s)"
  runs=$((runs + 1))
}

run ddp 2
run fsdp2 2
run zero3 2
run ddp 3
echo "srun: $runs runs passed"
