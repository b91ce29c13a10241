#!/usr/bin/env bash
# Builds and runs examples/ (an application depending on cpptrain) the ways a user would:
#   bazel  examples/ as its own workspace, cpptrain an external repository (its WORKSPACE:
#          local_repository + cpptrain_dependencies(), no .bazelrc), then runs the classifier;
#   cmake  the cpptrain libraries only (--target cpptrain), cmake --install into a temporary
#          prefix, examples/CMakeLists.txt against it (find_package), then runs the classifier;
#   subdir examples/CMakeLists.txt configured with add_subdirectory(cpptrain) (cpptrain built
#          inside the example's build tree), then runs the classifier.
# Before the Bazel build, checks that //:cpptrain reaches every library of the project that is
# not test-only, a tool or manual (NCCL). Each run must show that the model trained: the
# logged training loss fell, the final eval loss is below chance (ln 4) and the eval accuracy
# is at least 0.8 (the classifier itself also exits 1 below 0.8).
# Run by tools/test after `bazel test //...`. Prints one line per step with its time, one
# "consumer result:" line per run, and a closing "consumers: ..." line; exits 1 when a step
# failed.
#
#   tools/consumer_check.sh [bazel] [cmake] [subdir]      (default: all three)
#
# Caches, kept between runs like Bazel's: the disk cache ~/.cache/cpptrain-bazel-disk (shared
# with the project's .bazelrc; CPPTRAIN_BAZEL_DISK_CACHE overrides) and the CMake build
# directories (the libraries, the install prefix, emptied before each install, and the two
# example builds) under ~/.cache/cpptrain-consumer/<hash of the checkout path>
# (CPPTRAIN_CONSUMER_CACHE overrides). With both pointing at empty directories (and
# `bazel clean --expunge` in examples/) a run is cold, as on a fresh CI machine.
# CPPTRAIN_CONSUMER_JOBS (default 2) sets the parallel compiles of every build.
#
# The two CMake runs compile the same library sources with the same flags. Where ccache is
# installed they compile through it (CCACHE_DIR, default ~/.cache/cpptrain-consumer-ccache),
# with every absolute path rewritten relative to the compiler's directory (base_dir /), and
# the libraries' build tree at the same depth as the subdir build's cpptrain/ tree, so both
# command lines name the checkout and the generated headers by the same relative paths and
# the second build takes the first one's objects instead of compiling again (on a fresh
# machine that saves one whole library build; "ccache:" lines give the hit counts).
# CPPTRAIN_CONSUMER_CCACHE=0 compiles without it.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

steps=("$@")
if ((${#steps[@]} == 0)); then steps=(bazel cmake subdir); fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cache="${CPPTRAIN_CONSUMER_CACHE:-$HOME/.cache/cpptrain-consumer}/$(printf '%s' "$root" | md5sum | cut -c1-12)"
summary=()
failed=0
# Parallel compiles for Bazel and CMake (2 by default, as the project's .bazelrc).
jobs="${CPPTRAIN_CONSUMER_JOBS:-2}"

# step <name> <command>...: runs it with its output in $scratch/<name>.log, shown on failure.
step() {
  local name=$1
  shift
  local start=$SECONDS
  if "$@" >"$scratch/$name.log" 2>&1; then
    echo "consumer $name: ok in $((SECONDS - start)) s"
    return 0
  fi
  echo "consumer $name: FAILED after $((SECONDS - start)) s; its output:"
  tail -40 "$scratch/$name.log"
  return 1
}

# CMake arguments that compile through ccache (empty without it).
cmake_launcher=()
if [[ "${CPPTRAIN_CONSUMER_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null; then
  export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/cpptrain-consumer-ccache}"
  export CCACHE_BASEDIR=/ CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=time_macros
  cmake_launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

# ccache_line <name>: the hits and misses of the step just run, as one line (none without
# ccache). Reads the counters ccache keeps, zeroed before the step.
ccache_zero() { if ((${#cmake_launcher[@]})); then ccache -z >/dev/null 2>&1 || true; fi; }
ccache_line() {
  if ((${#cmake_launcher[@]} == 0)); then return 0; fi
  ccache --print-stats 2>/dev/null | awk -v name="$1" -F'\t' '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { hits += $2 }
    $1 == "cache_miss" { misses = $2 }
    END { printf "ccache: %s: %d compiles from the cache, %d compiled\n", name, hits, misses }'
}

bazel_flags=(
  --disk_cache="${CPPTRAIN_BAZEL_DISK_CACHE:-$HOME/.cache/cpptrain-bazel-disk}" --jobs="$jobs"
  --symlink_prefix=/
)

# check_trained <name>: the run's output ($scratch/<name>.log) shows a model that learned.
# Appends one line to $scratch/results; prints it too when the check fails.
check_trained() {
  local name=$1 out
  out=$(awk -v name="$name" '
    /^\[step / && !/ eval / {
      for (i = 1; i < NF; ++i) if ($i == "loss") { if (first == "") first = $(i + 1); last = $(i + 1) }
    }
    /^final:/ { final = 1; eval_loss = $(NF - 3) + 0; accuracy = $NF + 0 }
    END {
      if (!final || first == "") { print name ": FAILED: no final line or no logged loss"; exit 1 }
      problem = ""
      if (!(last + 0 < first + 0)) problem = "the training loss did not fall"
      else if (!(eval_loss < log(4))) problem = "the eval loss is not below chance (ln 4)"
      else if (!(accuracy >= 0.8)) problem = "the eval accuracy is below 0.8"
      printf "%s: logged loss %s -> %s, eval loss %.4f, eval accuracy %.4f%s\n", name, first,
             last, eval_loss, accuracy, problem == "" ? "" : "; FAILED: " problem
      exit problem != ""
    }' "$scratch/$name.log")
  local status=$?
  echo "$out" >>"$scratch/results"
  if ((status != 0)); then echo "consumer $out"; fi
  return $status
}

# The libraries of the project no longer reached from //:cpptrain (empty when it is complete).
umbrella_misses() {
  bazel query --noshow_progress 'kind("cc_library|cc_proto_library", //...)
    except attr(testonly, 1, //...) except //tools/... except //third_party/...
    except attr(tags, manual, //...) except deps(//:cpptrain)' 2>/dev/null
}

check_umbrella() {
  local misses
  misses=$(umbrella_misses) || { echo "bazel query failed"; return 1; }
  if [[ -n "$misses" ]]; then
    echo "//:cpptrain (BUILD.bazel) does not reach these libraries; add them to its deps:"
    echo "$misses"
    return 1
  fi
}

run_bazel() {
  step bazel_umbrella check_umbrella &&
    step bazel_build bash -c "cd examples && bazel build ${bazel_flags[*]} //:classifier" &&
    step bazel_run bash -c "cd examples && bazel run ${bazel_flags[*]} //:classifier -- \
      '$scratch/bazel_run'" &&
    check_trained bazel_run
  local status=$?
  # The example workspace has its own Bazel server; do not leave it running.
  (cd examples && bazel shutdown >/dev/null 2>&1)
  return $status
}

run_cmake() {
  # (libraries/cpptrain: the depth of subdir/cpptrain, for ccache; see the top.)
  local build="$cache/libraries/cpptrain" prefix="$cache/prefix" example="$cache/example"
  ccache_zero
  # (cmake --install keeps the files' times, so the example is rebuilt only for changes.)
  step cmake_libraries bash -c "
    cmake -S . -B '$build' -DCMAKE_BUILD_TYPE=Release -DCPPTRAIN_BUILD_TESTS=OFF \
      -DCPPTRAIN_BUILD_TOOLS=OFF -DCPPTRAIN_INSTALL=ON ${cmake_launcher[*]} &&
    cmake --build '$build' --target cpptrain -j$jobs &&
    rm -rf '$prefix' && cmake --install '$build' --prefix '$prefix'" &&
    ccache_line cmake_libraries &&
    step cmake_example bash -c "
      cmake -S examples -B '$example' -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH='$prefix' ${cmake_launcher[*]} &&
      cmake --build '$example' -j$jobs" &&
    step cmake_run "$example/classifier" "$scratch/cmake_run" &&
    check_trained cmake_run
}

run_subdir() {
  ccache_zero
  step subdir_build bash -c "
    cmake -S examples -B '$cache/subdir' -DCMAKE_BUILD_TYPE=Release \
      -DCPPTRAIN_CHECKOUT='$root' ${cmake_launcher[*]} &&
    cmake --build '$cache/subdir' -j$jobs" &&
    ccache_line subdir_build &&
    step subdir_run "$cache/subdir/classifier" "$scratch/subdir_run" &&
    check_trained subdir_run
}

for s in "${steps[@]}"; do
  case "$s" in
    bazel) run_bazel ;;
    cmake) run_cmake ;;
    subdir) run_subdir ;;
    *) echo "consumer_check: unknown step '$s' (bazel, cmake, subdir)" >&2; exit 2 ;;
  esac
  if (($? == 0)); then summary+=("$s ok"); else summary+=("$s FAILED"); failed=1; fi
done
if [[ -f "$scratch/results" ]]; then sed 's/^/consumer result: /' "$scratch/results"; fi
echo "consumers: $(IFS=,; echo "${summary[*]}" | sed 's/,/, /g')"
exit "$failed"
