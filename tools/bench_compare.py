#!/usr/bin/env python3
"""Runs tools/bench (ours) and tools/bench_torch.py (PyTorch's) N times each, interleaved, from
the same init directory, checks that they trained the same thing, and prints medians.

  tools/bench_compare.py --launch build/tools/launch --bench build/tools/bench \\
      --nproc 1 --engine fsdp2 --init_dir /tmp/bench_init --jsonl docs/benchmarks/x.jsonl

The first run of ours writes the model (config.json, model.safetensors) and every rank's token
ids into --init_dir when they are not there yet; every later run of either side starts from
them. Checks, each a failure (exit 1) that prints both values:
  - first_loss (the global loss of the first optimizer step, before any update) of every run,
    of both sides, within --tolerance (relative) of ours' first run;
  - last_loss likewise within --last_loss_tolerance (both sides train on the same tokens);
  - the same tokens_fingerprint (same token ids) and the same device type on every run.
A run that fails or prints no JSON line is exit 2.

ZeRO: --engine zero --zero_stage N [--offload_optimizer cpu] [--offload_param cpu] runs ours as
`tools/bench --engine=zero --set=zero.stage=N ...` and DeepSpeed's ZeRO of the same stage
and offload (bench_torch.py --engine zero, tools/install_deepspeed_wheels.sh's torchrun) by
default; --torch_engine zero_redundancy (DDP + ZeroRedundancyOptimizer), fsdp2 or fsdp2_offload
pairs ours with PyTorch's counterparts instead. Every JSON line goes to --jsonl with the
date, the git commit, the host's GPUs, the side and the run number added, as soon as its run
ends ("verified": null, so a call cut short keeps the runs that finished); when every run is
done a last line {"bench_compare": ..., "verified": true|false} records the check. Every line
of one comparison carries the same "compare" id.

Python standard library only: it runs where tools/bench_torch.py runs.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launch", required=True, help="our launcher (bazel-bin or CMake tools/launch)")
    p.add_argument("--bench", required=True, help="our tools/bench binary")
    p.add_argument("--torchrun", default="torchrun", help="torchrun of the Python with torch")
    p.add_argument("--init_dir", required=True, help="shared model and token ids (written once)")
    p.add_argument("--jsonl", default="", help="file every raw JSON line is appended to")
    p.add_argument("--runs", type=int, default=3, help="runs per side, interleaved")
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) per run")
    p.add_argument("--engine", default="ddp", choices=["local", "ddp", "fsdp1", "fsdp2", "zero"],
                   help="ours")
    p.add_argument("--zero_stage", type=int, default=1, choices=[1, 2, 3], help="--engine zero")
    p.add_argument("--offload_optimizer", default="none", choices=["none", "cpu"],
                   help="--engine zero: both sides (pinned host memory)")
    p.add_argument("--offload_param", default="none", choices=["none", "cpu"],
                   help="--engine zero --zero_stage 3: both sides")
    p.add_argument("--torch_engine", default="",
                   help="PyTorch's engine (default: --engine; local means no wrapper)")
    p.add_argument("--torch_impl", default="native", choices=["native", "hf"])
    p.add_argument("--torch_compile", action="store_true", help="torch.compile on PyTorch's side")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--bf16", default="true", choices=["true", "false"])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--micro_batch", type=int, default=4)
    p.add_argument("--grad_accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--weight_decay", type=float, default=0.0)
    p.add_argument("--tolerance", type=float, default=1e-3, help="first_loss, relative")
    p.add_argument("--last_loss_tolerance", type=float, default=1e-3, help="relative")
    p.add_argument("--ours_arg", action="append", default=[], help="extra flag for tools/bench")
    p.add_argument("--torch_arg", action="append", default=[], help="extra flag for bench_torch.py")
    p.add_argument("--timeout", type=int, default=600, help="seconds per run")
    p.add_argument("--log_dir", default="", help="where each run's output goes")
    a = p.parse_args()
    if a.engine != "zero" and (a.zero_stage != 1 or a.offload_optimizer != "none" or
                               a.offload_param != "none"):
        p.error(f"--zero_stage, --offload_optimizer and --offload_param are for --engine zero, "
                f"not --engine {a.engine}")
    if a.torch_engine == "fsdp2_offload" and a.offload_optimizer != "cpu":
        p.error("--torch_engine fsdp2_offload keeps the optimizer on the host: give "
                "--offload_optimizer cpu so ours does too")
    return a


def zero_args(a):
    """The ZeRO flags of each side: ours' --set overrides and bench_torch.py's (DeepSpeed only;
    PyTorch's counterparts take none)."""
    ours = [f"--set=zero.stage={a.zero_stage}"]
    theirs = [f"--stage={a.zero_stage}"]
    if a.offload_optimizer == "cpu":
        ours += ["--set=zero.offload_optimizer_device=CPU",
                 "--set=zero.offload_optimizer_pin_memory=true"]
        theirs.append("--offload_optimizer=cpu")
    if a.offload_param == "cpu":
        ours += ["--set=zero.offload_param_device=CPU",
                 "--set=zero.offload_param_pin_memory=true"]
        theirs.append("--offload_param=cpu")
    return ours, (theirs if (a.torch_engine or "zero") == "zero" else [])


def engine_tag(a):
    if a.engine != "zero":
        return a.engine
    return (f"zero{a.zero_stage}" + ("_oo" if a.offload_optimizer == "cpu" else "") +
            ("_op" if a.offload_param == "cpu" else ""))


def commands(a):
    shape = [f"--model={a.model}", f"--seq_len={a.seq_len}", f"--micro_batch={a.micro_batch}",
             f"--grad_accum={a.grad_accum}", f"--steps={a.steps}", f"--warmup={a.warmup}",
             f"--bf16={a.bf16}", f"--learning_rate={a.learning_rate!r}",
             f"--weight_decay={a.weight_decay!r}", f"--init_dir={a.init_dir}"]
    ours_zero, theirs_zero = zero_args(a) if a.engine == "zero" else ([], [])
    ours = [a.launch, f"--nproc_per_node={a.nproc}", "--master_port=0", a.bench,
            f"--engine={a.engine}"] + shape + ours_zero + a.ours_arg
    theirs = [a.torchrun, "--standalone", f"--nproc_per_node={a.nproc}",
              os.path.join(HERE, "bench_torch.py"), f"--engine={a.torch_engine or a.engine}",
              f"--device={a.device}", f"--impl={a.torch_impl}"] + shape + theirs_zero + a.torch_arg
    if a.torch_compile:
        theirs.append("--compile")
    return {"ours": ours, "torch": theirs}


def json_line(output):
    """The last line of `output` that is a bench's JSON result (our launcher prefixes [rank 0])."""
    for line in reversed(output.splitlines()):
        start = line.find('{"model"')
        if start >= 0:
            return json.loads(line[start:])
    return None


def run_once(name, command, a):
    print(f"== {name}: {' '.join(command)}", flush=True)
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=a.timeout)
        output, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired as e:
        output, code = (e.stdout or b"").decode(errors="replace"), "timeout"
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)
        with open(os.path.join(a.log_dir, name + ".log"), "w") as f:
            f.write(output)
    result = json_line(output) if code == 0 else None
    if result is None:
        tail = "\n".join(output.splitlines()[-30:])
        print(f"bench_compare: {name} failed (exit {code}, no JSON line):\n{tail}\n"
              f"command: {' '.join(command)}", file=sys.stderr)
        sys.exit(2)
    return result


def host_gpus():
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               timeout=30).stdout.split("\n")
        names = [n.strip() for n in names if n.strip()]
    except (OSError, subprocess.TimeoutExpired):
        names = []
    return f"{len(names)} x {names[0]}" if names else "no GPU"


def git_commit():
    # A copy of the tree without its history (the GPU machine's) names its commit here.
    if os.environ.get("CPPTRAIN_COMMIT"):
        return os.environ["CPPTRAIN_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
        return head + ("-dirty" if dirty.strip() else "") if head else "unknown"
    except OSError:
        return "unknown"


def relative(x, ref):
    if x is None or ref is None or not math.isfinite(x) or not math.isfinite(ref):
        return math.inf
    return abs(x - ref) / max(abs(ref), 1e-30)


def check(records, a):
    """Every failed check, as a line naming both values."""
    failures = []
    ref = records[0]  # ours, run 1
    for r in records:
        for key, tol in (("first_loss", a.tolerance), ("last_loss", a.last_loss_tolerance)):
            rel = relative(r.get(key), ref.get(key))
            if rel > tol:
                failures.append(f"{key} differs: {r['side']} run {r['run']} = {r.get(key)!r}, "
                                f"ours run 1 = {ref.get(key)!r} (relative {rel:.2e} > {tol:g})")
        if r.get("tokens_fingerprint") != ref.get("tokens_fingerprint"):
            failures.append(
                f"token ids differ: {r['side']} run {r['run']} has tokens_fingerprint "
                f"{r.get('tokens_fingerprint')}, ours run 1 {ref.get('tokens_fingerprint')} (a "
                f"tokens-*.safetensors file in {a.init_dir} changed, or tools/bench's token "
                "stream differs from the one that wrote it: delete those files to rewrite them)")
        if r["device"].split(":")[0] != ref["device"].split(":")[0]:
            failures.append(f"device differs: {r['side']} run {r['run']} ran on {r['device']}, "
                            f"ours run 1 on {ref['device']}")
    return failures


def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return None, "-"
    med = statistics.median(values)
    return med, f"{med:{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def table(records, a):
    print()
    print(f"{a.nproc} process(es), {a.model}, seq {a.seq_len}, micro-batch {a.micro_batch}, "
          f"accum {a.grad_accum}, {a.warmup}+{a.steps} steps, bf16 {a.bf16}; "
          f"median [min, max] of {a.runs} runs")
    print("| side | engine | tokens/s per GPU | peak GiB | host peak GiB | first_loss | last_loss |")
    print("|---|---|---|---|---|---|---|")
    medians = {}
    for side in ("ours", "torch"):
        rs = [r for r in records if r["side"] == side]
        med, tps = spread([r["tokens_per_s_per_gpu"] for r in rs], ",.0f")
        _, peak = spread([r["peak_memory_gib"] for r in rs], ".2f")
        _, host_peak = spread([r.get("host_peak_gib") for r in rs], ".2f")
        medians[side] = med
        engine = rs[0]["engine"] + (" (compiled)" if rs[0].get("compile") else "")
        if rs[0].get("impl") == "hf":
            engine += " (transformers)"
        losses = [f"{x:.9g}" if x is not None else "-"
                  for x in (rs[0]["first_loss"], rs[0]["last_loss"])]
        print(f"| {side} | {engine} | {tps} | {peak} | {host_peak} | {losses[0]} | {losses[1]} |")
    if medians["torch"]:
        print(f"ours / torch (medians of tokens/s per GPU): {medians['ours'] / medians['torch']:.3f}")
    for key in ("first_loss", "last_loss"):
        worst = max(relative(r.get(key), records[0].get(key)) for r in records)
        print(f"largest relative difference of {key} to ours run 1: {worst:.2e}")


def append_jsonl(path, record):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def main():
    a = parse_args()
    cmds = commands(a)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    # "compare" is on every line of this comparison, its runs and its check alike.
    common = {"date": date, "commit": git_commit(), "host_gpus": host_gpus(),
              "compare": f"{engine_tag(a)}-{a.model}-{a.nproc}-{date}"}
    records = []
    for run in range(1, a.runs + 1):
        for side in ("ours", "torch"):
            result = run_once(f"{side}_{engine_tag(a)}_{a.nproc}_run{run}", cmds[side], a)
            result.update(common, side=side, run=run, command=" ".join(cmds[side]),
                          verified=None)
            records.append(result)
            append_jsonl(a.jsonl, result)
            print(f"   first_loss {result['first_loss']!r} last_loss {result['last_loss']!r} "
                  f"tokens/s per GPU {result['tokens_per_s_per_gpu']}", flush=True)
    failures = check(records, a)
    append_jsonl(a.jsonl, dict(common, bench_compare=engine_tag(a), model=a.model, nproc=a.nproc,
                               seq_len=a.seq_len, micro_batch=a.micro_batch, runs=a.runs,
                               verified=not failures, failures=failures))
    table(records, a)
    if failures:
        print("\nbench_compare: FAILED, the two sides did not train the same thing:")
        for line in failures:
            print("  " + line)
        sys.exit(1)
    print(f"\nbench_compare: verified: first_loss of all {len(records)} runs within "
          f"{a.tolerance:g}, last_loss within {a.last_loss_tolerance:g}, same token ids")


if __name__ == "__main__":
    main()
