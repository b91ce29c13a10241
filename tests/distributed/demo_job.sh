# Sourced by the scripts that run tools/train's demo job for 3 steps on 2-3 CPU processes under
# a launcher (torchrun_test.sh, srun_test.sh), after setting `config`:
#   "${common[@]}"        the job's flags: 3 steps, a loss logged each, no eval or save, the
#                         CPU, ddp_timeout 120 s (a hang fails the test before its time limit)
#   engine_flag NAME      the --set flag selecting ddp, fsdp2 or zero3
#   losses DIR            the losses DIR/metrics.jsonl holds, on one line
export OMP_NUM_THREADS=1  # torchrun's default; tools/launch and srun are given the same
common=(--config="$config" --set=args.max_steps=3 --set=args.logging_steps=1
        --set=args.eval_strategy=NO --set=args.save_strategy=NO --set=args.use_cpu=true
        --set=args.ddp_timeout=120)
losses() { grep '"loss":' "$1/metrics.jsonl" | sed -E 's/.*"loss":([^,}]*).*/\1/' | tr '\n' ' '; }
engine_flag() {
  case "$1" in
    ddp) echo '--set=args.ddp={}' ;;
    fsdp2) echo '--set=args.fsdp={version: 2}' ;;
    zero3) echo '--set=args.zero={stage: 3}' ;;
  esac
}
