#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of fuzz/ (one per parser of outside input) with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer. Not a Bazel build: the project's Bazel
# toolchain is GCC, so fuzz/fuzz.mk compiles with clang (through ccache where installed) the
# sources `bazel query` lists for the Bazel libraries each target uses (FUZZ_DEPS below).
#
#   tools/fuzz.sh build [TARGET...]          build into $FUZZ_OUT (default build/fuzz)
#   tools/fuzz.sh run TARGET [FLAGS...]      fuzz TARGET on a work corpus seeded from
#                                            fuzz/corpus/TARGET (libFuzzer flags after it)
#   tools/fuzz.sh ci [SECONDS]               build all, run each SECONDS (default 20; the
#                                            JSON parser at least FUZZ_JSON_SECONDS, 30) from
#                                            its seeds; fails on any crash, sanitizer report,
#                                            leak, timeout (10 s) or OOM (2 GiB) of one input
#   tools/fuzz.sh nightly [SECONDS]          the same, every target SECONDS (default 600: 90
#                                            minutes in all), for a nightly job or before a
#                                            release
#   tools/fuzz.sh list                       the targets
#
# Crashing inputs go to $FUZZ_OUT/artifacts/TARGET/. A crash fixed in the project's code keeps
# its input in fuzz/corpus/TARGET/ (named crash-*), so every later run replays it first.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out="${FUZZ_OUT:-$root/build/fuzz}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
jobs="${FUZZ_JOBS:-$(nproc)}"
cxx="${FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || true)}"
# ccache (by content, so a fresh checkout reuses what an earlier one compiled), where present.
launcher=""
if [[ -z "${FUZZ_CXX:-}" ]] && command -v ccache >/dev/null; then
  launcher=ccache
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/cpptrain-fuzz-ccache}"
fi

TARGETS=(json_fuzzer safetensors_fuzzer hf_config_fuzzer token_file_fuzzer text_proto_fuzzer
  set_override_fuzzer trainer_state_fuzzer manifest_parse_fuzzer manifest_fuzzer
  accelerate_yaml_fuzzer hf_json_args_fuzzer)
# The Bazel libraries each target's fuzz/<target>.cc uses (and //checkpoint:files, for
# fuzz/fuzz_util.h): their source files (bazel query) are what fuzz/fuzz.mk compiles with clang.
declare -A FUZZ_DEPS=(
  [json_fuzzer]="//checkpoint:json"
  [safetensors_fuzzer]="//checkpoint:safetensors"
  [hf_config_fuzzer]="//checkpoint:hf_config //models:configs"
  [token_file_fuzzer]="//trainer/data:token_file_dataset"
  [text_proto_fuzzer]="//config:text_proto //config:training_args"
  [set_override_fuzzer]="//config:text_proto //proto:job_cc_proto"
  [trainer_state_fuzzer]="//checkpoint:manifest //checkpoint:safetensors //checkpoint:verify"
  [manifest_parse_fuzzer]="//checkpoint:manifest"
  [accelerate_yaml_fuzzer]="//config:accelerate_config //config:text_proto //proto:job_cc_proto"
  [hf_json_args_fuzzer]="//config:hf_json_args //config:text_proto //proto:training_args_cc_proto"
  [manifest_fuzzer]="//checkpoint:checkpoint //checkpoint:manifest //checkpoint:optimizer_state
    //checkpoint:safetensors //checkpoint:verify //engines/local:local_engine //models:configs"
)

# LibTorch, Abseil and protobuf are Debian's, built without ASan. alloc_dealloc_mismatch=0:
# LibTorch frees with free() some buffers it allocates with new[] (the vectors of its
# uninstrumented code), which ASan would report on its first tensor; detect_leaks stays on
# (libFuzzer checks every input that mallocs more than it frees).
export ASAN_OPTIONS="${ASAN_OPTIONS:-alloc_dealloc_mismatch=0:detect_leaks=1:abort_on_error=0:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# One OpenMP thread: each target is one core's work.
export OMP_NUM_THREADS=1
# The targets silence glog below errors themselves; no log files.
export GLOG_logtostderr=1

die() {
  echo "fuzz.sh: $*" >&2
  exit 2
}

# $out/sources.mk: each target's <target>_SRCS, from `bazel query`; written again when a BUILD
# file, this script or fuzz/fuzz.mk is newer.
sources() {
  local mk="$out/sources.mk" t
  if [[ -f "$mk" ]] && [[ -z "$(find . -path ./bazel-\* -prune -o \( -name BUILD.bazel -o \
    -path ./tools/fuzz.sh -o -path ./fuzz/fuzz.mk \) -newer "$mk" -print | head -1)" ]]; then
    return
  fi
  command -v bazel >/dev/null || die "no bazel to list the sources of the fuzz targets"
  {
    echo "# Written by tools/fuzz.sh from bazel query; do not edit."
    for t in "${TARGETS[@]}"; do
      # 3 is a partial result, as every query here gives: the proto rules' implicit
      # @com_google_protobuf dependencies are not in this offline workspace (nor sources).
      labels=$(bazel query --keep_going --noshow_progress --noimplicit_deps \
        "kind('source file', deps(set(//checkpoint:files ${FUZZ_DEPS[$t]})))" --output=label 2>"$out/query.log") ||
        [[ $? -eq 3 ]] || die "bazel query of ${FUZZ_DEPS[$t]} failed: $(tail -3 "$out/query.log")"
      # shellcheck disable=SC2046  # one line: the paths, split at spaces
      echo "${t}_SRCS :=" $(grep '^//' <<<"$labels" | sed -e 's|^//||; s|:|/|; s|^/||' |
        sed -n -e 's|^proto/\(.*\)\.proto$|gen/proto/\1.pb|p' -e 's|\.cc$||p' | sort)
    done
  } >"$mk.tmp"
  mv "$mk.tmp" "$mk"
}

build() {
  [[ -n "$cxx" ]] || die "no clang++ (install clang-14 and libclang-rt-14-dev: tools/install_deps.sh)"
  sources
  make --no-print-directory -f fuzz/fuzz.mk ROOT="$root" OUT="$out" CXX="$launcher $cxx" \
    LINKER="$cxx" -j"$jobs" "$@"
}

known() {
  local t
  for t in "${TARGETS[@]}"; do [[ "$t" == "$1" ]] && return 0; done
  die "unknown target '$1' (tools/fuzz.sh list)"
}

# libFuzzer flags every run uses: a crash of one input, 10 s on one input or 2 GiB is a failure.
common_flags() {
  local target="$1"
  mkdir -p "$out/artifacts/$target"
  echo "-timeout=10 -rss_limit_mb=2048 -artifact_prefix=$out/artifacts/$target/ -print_final_stats=1"
}

# Extra flags of a target (its dictionary, a length limit), from fuzz/<target>.options.
target_flags() {
  local options="fuzz/$1.options"
  if [[ -f "$options" ]]; then grep -v '^#' "$options" | tr '\n' ' '; fi
  if [[ -f "fuzz/$1.dict" ]]; then echo "-dict=fuzz/$1.dict"; fi
}

# Builds every target, then runs each from its seeds for $1 seconds (json_fuzzer for $2); fails
# when any target fails.
run_all() {
  local seconds="$1" json_seconds="$2" seconds_now start target work log status stats failed=()
  start=$(date +%s)
  build all
  echo "fuzz.sh: built ${#TARGETS[@]} targets in $(($(date +%s) - start)) s"
  for target in "${TARGETS[@]}"; do
    work="$(mktemp -d)"
    log="$out/logs/$target.log"
    mkdir -p "$out/logs"
    status=0
    [[ "$target" == json_fuzzer ]] && seconds_now="$json_seconds" || seconds_now="$seconds"
    # shellcheck disable=SC2046
    "$out/bin/$target" $(common_flags "$target") $(target_flags "$target") \
      -max_total_time="$seconds_now" "$work" "fuzz/corpus/$target" >"$log" 2>&1 || status=$?
    rm -rf "$work"
    stats=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 || true)
    if [[ $status -ne 0 ]]; then
      failed+=("$target")
      echo "fuzz.sh: $target FAILED (exit $status); the end of its log ($log):"
      tail -40 "$log"
    else
      echo "fuzz.sh: $target passed in ${seconds_now} s: ${stats:-no stats}"
    fi
  done
  echo "fuzz.sh: ${#TARGETS[@]} targets, ${#failed[@]} failed${failed:+: ${failed[*]}}," \
    "$(($(date +%s) - start)) s in all"
  [[ ${#failed[@]} -eq 0 ]]
}

case "${1:-}" in
  build)
    shift
    for t in "$@"; do known "$t"; done
    build "${@:-all}"
    ;;
  run)
    [[ $# -ge 2 ]] || die "usage: tools/fuzz.sh run TARGET [libFuzzer flags...]"
    target="$2"
    shift 2
    known "$target"
    build "$target"
    work="$out/corpus/$target"
    mkdir -p "$work"
    # shellcheck disable=SC2046
    exec "$out/bin/$target" $(common_flags "$target") $(target_flags "$target") "$@" \
      "$work" "fuzz/corpus/$target"
    ;;
  ci)
    # The JSON parser reads every checkpoint's headers and config.json: at least 30 s.
    json_seconds="${FUZZ_JSON_SECONDS:-30}"
    seconds="${2:-20}"
    ((json_seconds > seconds)) || json_seconds="$seconds"
    run_all "$seconds" "$json_seconds"
    ;;
  nightly)
    seconds="${2:-600}"
    run_all "$seconds" "$seconds"
    ;;
  list)
    printf '%s\n' "${TARGETS[@]}"
    ;;
  *)
    die "usage: tools/fuzz.sh build|run|ci|list (see the top of the script)"
    ;;
esac
