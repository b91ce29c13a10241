#!/usr/bin/env bash
# Test for tools/check_build_sync.sh, run by `bazel test //tests:build_sync_test` and by CTest
# (tests_build_sync_test). First proves on fixtures (tests/testdata/build_sync) that the
# checker passes when the builds agree, fails naming exactly the offending files when they do
# not, and refuses glob(); then runs it on the real CMakeLists.txt and BUILD files.
#
# Under Bazel the workspace tree holds only the files tests/BUILD.bazel lists as data, so a
# BUILD file missing from that list is not checked here (tools/check_build_sync.sh run from
# the repository root checks them all).

set -euo pipefail

root="${TEST_SRCDIR:?run under bazel test or ctest}/${TEST_WORKSPACE:?}"
checker="$root/tools/check_build_sync.sh"
fixtures="$root/tests/testdata/build_sync"
scratch="${TEST_TMPDIR:?}/build_sync"

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# make_tree <dir> <scenario>: lays the fixture out as a workspace.
make_tree() {
  local dir="$1" scenario="$2"
  rm -rf "$dir"
  mkdir -p "$dir/pkg/sub" "$dir/nested_repo"
  cp "$fixtures/root.BUILD" "$dir/BUILD.bazel"
  cp "$fixtures/pkg.BUILD" "$dir/pkg/BUILD.bazel"
  cp "$fixtures/pkg_sub.BUILD" "$dir/pkg/sub/BUILD"
  cp "$fixtures/nested_repo.BUILD" "$dir/nested_repo/BUILD.bazel"
  : >"$dir/nested_repo/WORKSPACE"
  if [[ "$scenario" == glob ]]; then
    mkdir -p "$dir/globbed"
    cp "$fixtures/glob.BUILD" "$dir/globbed/BUILD.bazel"
    cp "$fixtures/CMakeLists.agree.txt" "$dir/CMakeLists.txt"
  else
    cp "$fixtures/CMakeLists.$scenario.txt" "$dir/CMakeLists.txt"
  fi
}

# run_checker <dir>: sets $out and $rc.
run_checker() {
  rc=0
  out="$(bash "$checker" "$1" 2>&1)" || rc=$?
}

# 1. Agreeing fixture: passes.
make_tree "$scratch/agree" agree
run_checker "$scratch/agree"
if [[ $rc -ne 0 ]]; then
  fail "checker should pass on the agreeing fixture, exited $rc:"$'\n'"$out"
fi

# 2. Disagreeing fixture: exit 1, and the offenders are exactly these.
expected_offenders='  pkg/extra.cc  (pkg/BUILD.bazel)
  pkg/msg.proto  (pkg/BUILD.bazel)
  pkg/only_in_cmake.h'
make_tree "$scratch/disagree" disagree
run_checker "$scratch/disagree"
offenders="$(grep '^  ' <<<"$out" || true)"
if [[ $rc -ne 1 ]]; then
  fail "checker should exit 1 on the disagreeing fixture, exited $rc:"$'\n'"$out"
elif [[ "$offenders" != "$expected_offenders" ]]; then
  fail "checker named the wrong offenders on the disagreeing fixture."$'\n'"expected:"$'\n'"$expected_offenders"$'\n'"got:"$'\n'"$out"
fi

# 3. glob() in srcs: refused (exit 2), naming the BUILD file.
make_tree "$scratch/glob" glob
run_checker "$scratch/glob"
if [[ $rc -ne 2 || "$out" != *"globbed/BUILD.bazel"* ]]; then
  fail "checker should exit 2 naming globbed/BUILD.bazel, exited $rc:"$'\n'"$out"
fi

if [[ $failures -ne 0 ]]; then
  echo "$failures fixture check(s) failed; the real tree was not checked." >&2
  exit 1
fi
echo "fixtures: OK (agree passes, disagree names its 3 offenders, glob is refused)"

# 4. The real builds.
exec bash "$checker" "$root"
