#!/usr/bin/env bash
# Builds and runs examples/ (an application depending on cpptrain) the ways a user would:
#   bazel  examples/ as its own workspace, cpptrain an external repository (its WORKSPACE:
#          local_repository + cpptrain_dependencies(), no .bazelrc), then runs the classifier;
#   cmake  the cpptrain libraries only (--target cpptrain), cmake --install into a temporary
#          prefix, examples/CMakeLists.txt against it (find_package), then runs the classifier;
#   subdir examples/CMakeLists.txt configured with add_subdirectory(cpptrain) and one library
#          built there (a full build would compile every library a second time).
# Run by tools/test after `bazel test //...`. Prints one line per step with its time, and a
# closing "consumers: ..." line; exits 1 when a step failed.
#
#   tools/consumer_check.sh [bazel] [cmake] [subdir]      (default: all three)
#
# Caches, kept between runs like Bazel's: the disk cache ~/.cache/cpptrain-bazel-disk (shared
# with the project's .bazelrc) and the CMake build directories (the libraries, the install
# prefix, emptied before each install, and the two example builds) under
# ~/.cache/cpptrain-consumer/<hash of the checkout path> (CPPTRAIN_CONSUMER_CACHE overrides).
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

bazel_flags=(
  --disk_cache="$HOME/.cache/cpptrain-bazel-disk" --jobs=2
  --spawn_strategy=processwrapper-sandbox,local --symlink_prefix=/
)

run_bazel() {
  step bazel_build bash -c "cd examples && bazel build ${bazel_flags[*]} //:classifier" &&
    step bazel_run bash -c "cd examples && bazel run ${bazel_flags[*]} //:classifier -- \
      '$scratch/bazel_run'"
  local status=$?
  # The example workspace has its own Bazel server; do not leave it running.
  (cd examples && bazel shutdown >/dev/null 2>&1)
  return $status
}

run_cmake() {
  local build="$cache/cmake-build" prefix="$cache/prefix" example="$cache/example"
  # (cmake --install keeps the files' times, so the example is rebuilt only for changes.)
  step cmake_libraries bash -c "
    cmake -S . -B '$build' -DCMAKE_BUILD_TYPE=Release -DCPPTRAIN_BUILD_TESTS=OFF \
      -DCPPTRAIN_BUILD_TOOLS=OFF -DCPPTRAIN_INSTALL=ON &&
    cmake --build '$build' --target cpptrain -j2 &&
    rm -rf '$prefix' && cmake --install '$build' --prefix '$prefix'" &&
    step cmake_example bash -c "
      cmake -S examples -B '$example' -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH='$prefix' &&
      cmake --build '$example' -j2" &&
    step cmake_run "$example/classifier" "$scratch/cmake_run"
}

run_subdir() {
  step subdir bash -c "
    cmake -S examples -B '$cache/subdir' -DCMAKE_BUILD_TYPE=Release \
      -DCPPTRAIN_CHECKOUT='$root' &&
    cmake --build '$cache/subdir' --target config_training_args -j2"
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
grep -h "^final:" "$scratch"/bazel_run.log "$scratch"/cmake_run.log 2>/dev/null |
  sed 's/^/consumer result: /'
echo "consumers: $(IFS=,; echo "${summary[*]}" | sed 's/,/, /g')"
exit "$failed"
