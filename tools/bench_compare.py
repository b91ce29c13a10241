#!/usr/bin/env python3
"""Runs tools/bench (ours) and tools/bench_torch.py (PyTorch's) N times each, interleaved, from
the same init directory, checks that they trained the same thing, and prints medians.

  tools/bench_compare.py --launch build/tools/launch --bench build/tools/bench \\
      --nproc 1 --engine fsdp2 --init_dir /tmp/bench_init --jsonl docs/benchmarks/x.jsonl

The first run of ours writes the model (config.json, model.safetensors) and every rank's token
ids into --init_dir when they are not there yet; every later run of either side starts from
them. The tokens (--tokens markov, tools/bench_verification.h) are learnable, so the loss falls
well beyond the tolerances over the run and a side that trained differently ends elsewhere.
Checks, each a failure (exit 1) that names the check and prints both values, against ours'
first run:
  - ours' loss fell from the first to the last step by at least --min_loss_fall (relative):
    otherwise the other checks could not tell a side whose optimizer did nothing;
  - first_loss (the global loss of the first optimizer step, before any update) of every run,
    of both sides, within --tolerance (relative);
  - first_grad_norm (the first step's global gradient norm before clipping) within
    --grad_norm_tolerance (relative): a gradient scaled by 1.002 fails it; between runs whose
    parameters differ in precision (PyTorch's fp32 under autocast against ours' bf16 working
    copies on a GPU) within --mixed_grad_norm_tolerance (2.5e-3), as bf16 rounding of the
    parameters alone moves it 1.0-1.44e-3 (H200, Qwen3-0.6B);
  - last_loss within --last_loss_tolerance times how far ours' loss moved (first - last);
  - param_checksum (the sum of squares of the trained parameters, fp64) within
    --checksum_tolerance (relative);
  - the same tokens_fingerprint (same token ids) and the same device type on every run.
--records FILE (repeatable) runs nothing: it applies the same checks and table to raw lines
already written, for a row whose runs a call's time limit split over calls on one machine. The
lines must agree on the shape, the flags of each side, the commit (a "-dirty" commit does not
tell two uncommitted trees apart: say which tree ran) and the GPU model (not the machine: say
which lease ran them); sweep lines are left out, the first ours line is the reference, and the
runs are numbered in the order read. Lines that are not one row are exit 2.
A run that fails or prints no JSON line is exit 2. tools/bench_fault_test.sh (CI) checks that a
no-op optimizer, a gradient scaled by 1.002 and other tokens on one side each exit 1, with
--baseline ours --baseline_arg=--inject_fault=... (the baseline is tools/bench again).

PyTorch's side at its strongest: --torch_config NAME runs one of TORCH_CONFIGS (below: compiled
model and loss, SDPA's native GQA, Liger's fused linear cross-entropy, bf16 parameters through
fully_shard, a compiled AdamW, CUDA graphs); --torch_sweep NAME,NAME,... runs each once first
(their lines say "sweep": true), then compares ours with the fastest of those whose checks
passed, and names it. --peak_tflops and --peak_source (how the peak was measured:
tools/matmul_peak.py) go to both sides and onto every line; the table gives MFU both ways.

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
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# PyTorch configurations a PyTorch expert would try, as bench_torch.py flags. "compile_scope"
# model becomes layers under fully_shard (the head and loss then compile together); "engine"
# names PyTorch's engine for one-process local or DDP comparisons: fsdp2 is bf16 parameters with
# fp32 masters (fully_shard with MixedPrecisionPolicy) in place of fp32 parameters under
# autocast, ddp the model under DistributedDataParallel.
FULL = ["--compile", "--compile_scope=model", "--loss=inside", "--attention=gqa"]
TORCH_CONFIGS = {
    # The earlier baseline: the model (local) or each layer compiled, the loss eager, GQA keys and
    # values by repeat_interleave, fp32 parameters under bf16 autocast, fused AdamW.
    "compiled-model": {"args": ["--compile"]},
    # The same with CUDA graphs (reduce-overhead): with --torch_impl hf, transformers' model at its
    # strongest here (its loss is computed outside: the compiled-full configurations need the
    # native model).
    "compiled-model-graphs": {"args": ["--compile", "--compile_mode=reduce-overhead"]},
    # The same under DistributedDataParallel on one GPU, the whole wrapped model compiled: for
    # transformers' model, what compiled-full-graphs-ddp is for the native one.
    "compiled-model-graphs-ddp": {"engine": "ddp",
                                  "args": ["--compile", "--compile_scope=model",
                                           "--compile_mode=reduce-overhead"]},
    # Model and loss compiled together (fullgraph where it traces whole), SDPA's native GQA.
    "compiled-full": {"args": FULL},
    "compiled-full-autotune": {"args": FULL + ["--compile_mode=max-autotune-no-cudagraphs"]},
    # CUDA graphs (compile's reduce-overhead): the fair pair of ours with --cuda_graphs.
    "compiled-full-graphs": {"args": FULL + ["--compile_mode=reduce-overhead"]},
    # The same under DistributedDataParallel on one GPU: compile then splits the graph at DDP's
    # buckets, and on an H100 (2026-12-06) that ran 4% faster than the unwrapped model at the
    # Qwen3-0.6B shape, so a one-GPU local row is compared with it too.
    "compiled-full-graphs-ddp": {"engine": "ddp",
                                 "args": FULL + ["--compile_mode=reduce-overhead"]},
    # AdamW (foreach) compiled with the clipping into one step, in place of the fused kernel.
    "compiled-full-adamw": {"args": FULL + ["--optimizer=compiled"]},
    # Liger's fused linear cross-entropy, with the model eager and with its layers compiled.
    "liger-eager": {"args": ["--loss=liger", "--attention=gqa"]},
    "liger-compiled": {"args": ["--compile", "--compile_scope=layers", "--loss=liger",
                                "--attention=gqa"]},
    # bf16 parameters with fp32 masters: fully_shard's MixedPrecisionPolicy on one GPU.
    "bf16-params": {"engine": "fsdp2", "args": ["--compile", "--loss=inside", "--attention=gqa"]},
    "bf16-params-liger": {"engine": "fsdp2",
                          "args": ["--compile", "--loss=liger", "--attention=gqa"]},
    # The eager model, as it was first compared.
    "eager": {"args": []},
}


def torch_config(a, name):
    """(engine, bench_torch.py flags) of configuration `name` in this comparison."""
    if name not in TORCH_CONFIGS:
        raise SystemExit(f"bench_compare: --torch_config/--torch_sweep {name!r} is unknown; "
                         f"choose from {', '.join(TORCH_CONFIGS)}")
    config = TORCH_CONFIGS[name]
    engine = config.get("engine", a.torch_engine or a.engine)
    if "engine" in config and not (a.nproc == 1 and (a.torch_engine or a.engine) in ("local", "ddp")):
        raise SystemExit(f"bench_compare: {name} runs PyTorch's {config['engine']} in place of "
                         f"{a.torch_engine or a.engine}: only beside one-process local or DDP runs")
    if engine == "zero" and config["args"]:
        raise SystemExit(f"bench_compare: {name} sets bench_torch.py flags DeepSpeed's engine does "
                         "not take; give --torch_engine (zero_redundancy, fsdp2) for it")
    flags = list(config["args"])
    if engine.startswith("fsdp"):
        flags = [f for f in flags if f != "--compile_scope=model"]
    return engine, flags


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", action="append", default=[],
                   help="raw lines to check and tabulate; runs nothing (see above)")
    p.add_argument("--launch", help="our launcher (bazel-bin or CMake tools/launch); required "
                   "unless --records")
    p.add_argument("--bench", help="our tools/bench binary; required unless --records")
    p.add_argument("--torchrun", default="torchrun", help="torchrun of the Python with torch")
    p.add_argument("--init_dir",
                   help="shared model and token ids (written once); required unless --records")
    p.add_argument("--jsonl", default="", help="file every raw JSON line is appended to")
    p.add_argument("--runs", type=int, default=3,
                   help="runs per side, interleaved (0 with --torch_sweep: the sweep alone)")
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
    p.add_argument("--torch_compile", action="store_true",
                   help="torch.compile on PyTorch's side (--torch_config compiled-model)")
    p.add_argument("--torch_config", default="", help="one of TORCH_CONFIGS for PyTorch's side")
    p.add_argument("--torch_sweep", default="",
                   help="comma-separated TORCH_CONFIGS: each runs once, the fastest that passes "
                        "the checks is compared")
    p.add_argument("--baseline", default="torch", choices=["torch", "ours"],
                   help="the other side: PyTorch (bench_torch.py), or tools/bench again (with "
                        "--baseline_arg, e.g. --inject_fault=..., to test the checks)")
    p.add_argument("--baseline_arg", action="append", default=[],
                   help="--baseline ours: extra flag for its tools/bench")
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
    p.add_argument("--tokens", default="markov", choices=["markov", "random"],
                   help="markov: learnable (the loss falls); random: uniform ids")
    p.add_argument("--tolerance", type=float, default=1e-3, help="first_loss, relative")
    p.add_argument("--grad_norm_tolerance", type=float, default=1e-3,
                   help="first_grad_norm, relative")
    p.add_argument("--mixed_grad_norm_tolerance", type=float, default=2.5e-3,
                   help="first_grad_norm, relative, between runs that keep their parameters in "
                        "different precisions (fp32 under autocast against bf16 working "
                        "copies): 1.0e-3 to 1.44e-3 apart on an H200, Qwen3-0.6B")
    p.add_argument("--checksum_tolerance", type=float, default=1e-3,
                   help="param_checksum, relative")
    p.add_argument("--last_loss_tolerance", type=float, default=0.05,
                   help="last_loss: this fraction of how far ours' loss moved over the run")
    p.add_argument("--min_loss_fall", type=float, default=0.01,
                   help="ours' loss must fall by this fraction of first_loss over the run")
    p.add_argument("--peak_tflops", type=float, default=790.0,
                   help="measured dense bf16 TFLOP/s of one GPU, for MFU (tools/matmul_peak.py)")
    p.add_argument("--peak_source", default="",
                   help="how --peak_tflops was measured (recorded on every line)")
    p.add_argument("--ours_arg", action="append", default=[], help="extra flag for tools/bench")
    p.add_argument("--torch_arg", action="append", default=[], help="extra flag for bench_torch.py")
    p.add_argument("--timeout", type=int, default=600, help="seconds per run")
    p.add_argument("--log_dir", default="", help="where each run's output goes")
    a = p.parse_args()
    missing = [f"--{k}" for k in ("launch", "bench", "init_dir") if not getattr(a, k)]
    if missing and not a.records:
        p.error(f"{', '.join(missing)} required (or --records, to check lines already written)")
    if a.engine != "zero" and (a.zero_stage != 1 or a.offload_optimizer != "none" or
                               a.offload_param != "none"):
        p.error(f"--zero_stage, --offload_optimizer and --offload_param are for --engine zero, "
                f"not --engine {a.engine}")
    if a.torch_engine == "fsdp2_offload" and a.offload_optimizer != "cpu":
        p.error("--torch_engine fsdp2_offload keeps the optimizer on the host: give "
                "--offload_optimizer cpu so ours does too")
    if a.runs < 0 or (a.runs == 0 and not a.torch_sweep):
        p.error(f"--runs {a.runs}: give at least 1 (0 only with --torch_sweep, to sweep alone)")
    if a.torch_config and a.torch_sweep:
        p.error("--torch_config names one configuration and --torch_sweep several: give one")
    if a.baseline == "ours" and (a.torch_config or a.torch_sweep or a.torch_compile):
        p.error("--baseline ours runs tools/bench twice: --torch_config, --torch_sweep and "
                "--torch_compile are for --baseline torch")
    if a.torch_compile:
        a.torch_config = a.torch_config or "compiled-model"
    return a


def zero_args(a, torch_engine):
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
    return ours, (theirs if torch_engine == "zero" else [])


def engine_tag(a):
    if a.engine != "zero":
        return a.engine
    return (f"zero{a.zero_stage}" + ("_oo" if a.offload_optimizer == "cpu" else "") +
            ("_op" if a.offload_param == "cpu" else ""))


def commands(a, config=""):
    """The command of each side; `config` names PyTorch's configuration (TORCH_CONFIGS)."""
    shape = [f"--model={a.model}", f"--seq_len={a.seq_len}", f"--micro_batch={a.micro_batch}",
             f"--grad_accum={a.grad_accum}", f"--steps={a.steps}", f"--warmup={a.warmup}",
             f"--bf16={a.bf16}", f"--learning_rate={a.learning_rate!r}",
             f"--weight_decay={a.weight_decay!r}", f"--init_dir={a.init_dir}",
             f"--tokens={a.tokens}", f"--peak_tflops={a.peak_tflops!r}"]
    torch_engine, config_flags = (torch_config(a, config) if config
                                  else (a.torch_engine or a.engine, []))
    ours_zero, theirs_zero = zero_args(a, torch_engine) if a.engine == "zero" else ([], [])
    ours = [a.launch, f"--nproc_per_node={a.nproc}", "--master_port=0", a.bench,
            f"--engine={a.engine}"] + shape + ours_zero + a.ours_arg
    if a.baseline == "ours":
        return {"ours": ours, "baseline": ours + a.baseline_arg}
    theirs = [a.torchrun, "--standalone", f"--nproc_per_node={a.nproc}",
              os.path.join(HERE, "bench_torch.py"), f"--engine={torch_engine}",
              f"--device={a.device}", f"--impl={a.torch_impl}"] + shape + theirs_zero
    return {"ours": ours, "baseline": theirs + config_flags + a.torch_arg}


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


def parameter_precision(r):
    """bf16 where a run computes with bf16 parameters (ours' working copies on a GPU; PyTorch's
    fully_shard MixedPrecisionPolicy or DeepSpeed's bf16), fp32 otherwise (fp32 parameters,
    under bf16 autocast or not)."""
    if not r.get("bf16") or not str(r.get("device", "")).startswith("cuda"):
        return "fp32"
    if r.get("side") == "ours":
        return "bf16"
    engine = str(r.get("engine", ""))
    return "bf16" if engine.startswith(("torch_fsdp2", "deepspeed_zero")) else "fp32"


def check(records, a):
    """Every failed check, as a line naming it and both values."""
    failures = []
    ref = records[0]  # ours, run 1
    fall = (ref.get("first_loss") or 0) - (ref.get("last_loss") or 0)
    if not fall >= a.min_loss_fall * abs(ref.get("first_loss") or 0):
        failures.append(
            f"loss_fall: ours run 1 went from {ref.get('first_loss')!r} to {ref.get('last_loss')!r} "
            f"(fell {fall:.3g}, less than {a.min_loss_fall:g} of the first loss): the checks "
            "below cannot tell an optimizer that did nothing; use --tokens markov, more "
            "--steps or a larger --learning_rate")
    fall = abs(fall)
    for r in records:
        who = f"{r['side']} run {r['run']}" + (f" ({r['config']})" if r.get("config") else "")
        # Parameters rounded to bf16 move the gradient norm by about 1e-3 by themselves.
        grad_tol = (a.grad_norm_tolerance
                    if parameter_precision(r) == parameter_precision(ref)
                    else max(a.grad_norm_tolerance, a.mixed_grad_norm_tolerance))
        for key, tol in (("first_loss", a.tolerance), ("first_grad_norm", grad_tol),
                         ("param_checksum", a.checksum_tolerance)):
            rel = relative(r.get(key), ref.get(key))
            if rel > tol:
                failures.append(f"{key} differs: {who} = {r.get(key)!r}, ours run 1 = "
                                f"{ref.get(key)!r} (relative {rel:.2e} > {tol:g})")
        moved = abs((r.get("last_loss") or math.inf) - (ref.get("last_loss") or math.inf))
        if not moved <= a.last_loss_tolerance * fall:
            failures.append(
                f"last_loss differs: {who} = {r.get('last_loss')!r}, ours run 1 = "
                f"{ref.get('last_loss')!r} ({moved:.3g} apart, more than {a.last_loss_tolerance:g} "
                f"of the {fall:.3g} ours' loss moved)")
        if r.get("tokens_fingerprint") != ref.get("tokens_fingerprint"):
            failures.append(
                f"token ids differ: {who} has tokens_fingerprint "
                f"{r.get('tokens_fingerprint')}, ours run 1 {ref.get('tokens_fingerprint')} (a "
                f"tokens-*.safetensors file in {a.init_dir} changed, or tools/bench's token "
                "stream differs from the one that wrote it: delete those files to rewrite them)")
        if r["device"].split(":")[0] != ref["device"].split(":")[0]:
            failures.append(f"device differs: {who} ran on {r['device']}, "
                            f"ours run 1 on {ref['device']}")
    return failures


def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return None, "-"
    med = statistics.median(values)
    return med, f"{med:{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def table(records, a):
    counts = {side: sum(r["side"] == side for r in records) for side in ("ours", side_label(a))}
    runs = (f"{a.runs} runs" if len(set(counts.values())) == 1 else
            " and ".join(f"{n} runs of {side}" for side, n in counts.items()))
    print()
    print(f"{a.nproc} process(es), {a.model}, seq {a.seq_len}, micro-batch {a.micro_batch}, "
          f"accum {a.grad_accum}, {a.warmup}+{a.steps} steps, bf16 {a.bf16}, tokens {a.tokens}; "
          f"median [min, max] of {runs}")
    print("| side | engine | tokens/s per GPU | MFU causal/989 | MFU full/measured | peak GiB | "
          "host peak GiB | first_loss | last_loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    medians = {}
    for side in ("ours", side_label(a)):
        rs = [r for r in records if r["side"] == side]
        med, tps = spread([r["tokens_per_s_per_gpu"] for r in rs], ",.0f")
        _, mfu_causal = spread([r.get("mfu_causal_spec") for r in rs], ".3f")
        _, mfu_full = spread([r.get("mfu_full_measured") for r in rs], ".3f")
        _, peak = spread([r["peak_memory_gib"] for r in rs], ".2f")
        _, host_peak = spread([r.get("host_peak_gib") for r in rs], ".2f")
        medians[side] = med
        engine = rs[0]["engine"] + (f" [{rs[0]['config']}]" if rs[0].get("config") else
                                    " (compiled)" if rs[0].get("compile") else "")
        if rs[0].get("impl") == "hf":
            engine += " (transformers)"
        losses = [f"{x:.9g}" if x is not None else "-"
                  for x in (rs[0]["first_loss"], rs[0]["last_loss"])]
        print(f"| {side} | {engine} | {tps} | {mfu_causal} | {mfu_full} | {peak} | {host_peak} | "
              f"{losses[0]} | {losses[1]} |")
    for side in ("ours", side_label(a)):  # where each side's peak is (the first run's)
        phases = next((r.get("peak_by_phase_gib") for r in records if r["side"] == side), None)
        if phases:
            print(f"{side} peak GiB by phase: " +
                  ", ".join(f"{name} {gib}" for name, gib in phases.items()))
    if medians[side_label(a)]:
        print(f"ours / {side_label(a)} (medians of tokens/s per GPU): "
              f"{medians['ours'] / medians[side_label(a)]:.3f}")
    for key in ("first_loss", "first_grad_norm", "param_checksum", "last_loss"):
        worst = max(relative(r.get(key), records[0].get(key)) for r in records)
        print(f"largest relative difference of {key} to ours run 1: {worst:.2e}")


def side_label(a):
    """The other side's name in the records: torch (bench_torch.py) or baseline (ours again)."""
    return "torch" if a.baseline == "torch" else "baseline"


def append_jsonl(path, record):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def run_side(a, name, command, common, side, run, **extra):
    """One run, its JSON line recorded as soon as it ends."""
    result = run_once(name, command, a)
    result.update(common, side=side, run=run, command=" ".join(command), verified=None, **extra)
    append_jsonl(a.jsonl, result)
    print(f"   first_loss {result['first_loss']!r} last_loss {result['last_loss']!r} "
          f"first_grad_norm {result.get('first_grad_norm')!r} tokens/s per GPU "
          f"{result['tokens_per_s_per_gpu']}", flush=True)
    return result


def sweep(a, common):
    """Runs every --torch_sweep configuration once beside one run of ours; returns the name of
    the fastest whose checks passed (exit 1 when none did)."""
    names = [n for n in a.torch_sweep.split(",") if n]
    for name in names:
        torch_config(a, name)  # refuses unknown or inapplicable names before anything runs
    ours = run_side(a, f"ours_{engine_tag(a)}_{a.nproc}_sweep", commands(a)["ours"], common,
                    "ours", 0, sweep=True)
    passed = []
    print("\nsweep of PyTorch's configurations (one run each, checked against ours):")
    for name in names:
        r = run_side(a, f"torch_{name}_{a.nproc}_sweep", commands(a, name)["baseline"], common,
                     "torch", 0, sweep=True, config=name)
        failures = check([ours, r], a)
        print(f"   {name}: {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, peak "
              f"{r['peak_memory_gib']} GiB, {'checks pass' if not failures else failures}")
        if not failures:
            passed.append(r)
    if not passed:
        print("bench_compare: FAILED, no configuration of the sweep trained as ours did")
        sys.exit(1)
    best = max(passed, key=lambda r: r["tokens_per_s_per_gpu"])
    print(f"   fastest that passes: {best['config']}")
    append_jsonl(a.jsonl, dict(common, torch_sweep=names, best=best["config"], passed=[
        r["config"] for r in passed], verified=None))
    return best["config"]


def records_error(what):
    print(f"bench_compare: --records {what}", file=sys.stderr)
    sys.exit(2)


def read_lines(paths):
    """The run lines of `paths` (sweep and check lines left out); exit 2 when one cannot be
    read."""
    lines = []
    for path in paths:
        try:
            with open(path) as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    r = json.loads(line)
                    if "side" in r and not r.get("sweep"):
                        lines.append(r)
        except (OSError, ValueError) as e:
            records_error(f"cannot read {path}: {e}")
    return lines


def read_records(a):
    """The run lines of --records, renumbered per side in the order read; `a` takes the row's
    shape from them. Exit 2 when the lines are not one row of one tree and machine kind."""
    records, runs = [], {}
    for r in read_lines(a.records):
        runs[r["side"]] = runs.get(r["side"], 0) + 1
        records.append(dict(r, run=runs[r["side"]]))
    records.sort(key=lambda r: r["side"] != "ours")  # stable: ours' first read leads
    if "ours" not in runs or len(runs) != 2:
        records_error(f"needs runs of ours and one other side, found {runs}")
    shape = ("model", "seq_len", "micro_batch", "grad_accum", "steps", "warmup", "bf16",
             "tokens", "learning_rate", "weight_decay", "gpus", "commit", "host_gpus",
             "activation_checkpointing")
    for key in shape:  # numbers compare as numbers: one side writes 0, the other 0.0
        values = {str(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool)
                  else str(v) for v in (r.get(key) for r in records)}
        if len(values) > 1:
            records_error(f"mixes runs of different {key}: {sorted(values)}")
    if len({r["device"].split(":")[0] for r in records}) > 1:
        records_error("mixes runs on different devices")
    for side in runs:  # each side's runs ran one command line
        commands_run = {r.get("command") for r in records if r["side"] == side}
        if len(commands_run) > 1:
            records_error(f"holds {side} runs of different commands: "
                          f"{sorted(map(str, commands_run))}")
    ref = records[0]
    # tools/bench's engine label: the flag, or zero<stage>[_offload] (optimizer offload).
    engine = re.fullmatch(r"zero([123])(_offload)?|(local|ddp|fsdp1|fsdp2)", ref["engine"])
    if engine is None:
        records_error(f"ours' engine {ref['engine']!r} is not one this script runs")
    a.engine = engine.group(3) or "zero"
    if engine.group(1):
        a.zero_stage = int(engine.group(1))
        a.offload_optimizer = "cpu" if engine.group(2) else "none"
    a.model, a.seq_len, a.micro_batch = ref["model"], ref["seq_len"], ref["micro_batch"]
    a.grad_accum, a.steps, a.warmup = ref["grad_accum"], ref["steps"], ref["warmup"]
    a.bf16, a.tokens, a.nproc = ref["bf16"], ref["tokens"], ref.get("gpus", 1)
    a.init_dir = ref.get("init_dir")
    a.runs = max(runs.values())
    a.baseline = "ours" if "baseline" in runs else "torch"
    if side_label(a) not in runs:
        records_error(f"the other side is neither torch nor baseline: {sorted(runs)}")
    return records


def main():
    a = parse_args()
    if a.records:
        records = read_records(a)
        config = next((r["config"] for r in records if r["side"] != "ours" and r.get("config")),
                      None)
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        common = {"date": date, "records": a.records, "commit": records[0].get("commit"),
                  "host_gpus": records[0].get("host_gpus"),
                  "compares": sorted({r.get("compare") for r in records if r.get("compare")})}
        return report(a, records, common, config)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    # "compare" is on every line of this comparison, its runs and its check alike.
    common = {"date": date, "commit": git_commit(), "host_gpus": host_gpus(),
              "compare": f"{engine_tag(a)}-{a.model}-{a.nproc}-{date}",
              "peak_source": a.peak_source or None}
    config = sweep(a, common) if a.torch_sweep else a.torch_config
    if a.runs == 0:  # the sweep alone (each configuration checked against one run of ours)
        print(f"bench_compare: swept, fastest {config}; --runs 0 compares nothing further")
        return
    cmds = commands(a, config)
    extra = {"config": config} if config else {}
    records = []
    for run in range(1, a.runs + 1):
        for side, label in (("ours", "ours"), ("baseline", side_label(a))):
            records.append(run_side(a, f"{label}_{engine_tag(a)}_{a.nproc}_run{run}", cmds[side],
                                    common, label, run, **(extra if side != "ours" else {})))
    report(a, records, common, config)


def report(a, records, common, config):
    """Checks `records`, appends the check's line to --jsonl, prints the table and the outcome
    (exit 1 when a check failed)."""
    failures = check(records, a)
    append_jsonl(a.jsonl, dict(common, bench_compare=engine_tag(a), model=a.model, nproc=a.nproc,
                               seq_len=a.seq_len, micro_batch=a.micro_batch, runs=a.runs,
                               torch_config=config or None, verified=not failures,
                               failures=failures))
    table(records, a)
    if failures:
        print("\nbench_compare: FAILED, the two sides did not train the same thing:")
        for line in failures:
            print("  " + line)
        sys.exit(1)
    mixed = any(parameter_precision(r) != parameter_precision(records[0]) for r in records)
    grad = (f"{a.grad_norm_tolerance:g}" if not mixed else
            f"{a.grad_norm_tolerance:g} ({max(a.grad_norm_tolerance, a.mixed_grad_norm_tolerance):g}"
            " between runs whose parameters differ in precision)")
    print(f"\nbench_compare: verified: over {len(records)} runs, first_loss within "
          f"{a.tolerance:g}, first_grad_norm within {grad}, param_checksum "
          f"within {a.checksum_tolerance:g}, last_loss within {a.last_loss_tolerance:g} of the "
          f"loss's fall, same token ids")


if __name__ == "__main__":
    main()
