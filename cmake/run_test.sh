#!/bin/sh
# Runs one CTest test the way `bazel test` does (used by _cpptrain_add_test in
# cmake/CppTrainRules.cmake):
#   - $TEST_SRCDIR/$TEST_WORKSPACE is rebuilt as a runfiles tree holding only the test's data:
#     each "-l DEST=SRC" makes DEST (relative to the workspace) a link to SRC; DEST "." makes
#     the whole workspace a link to SRC (a directory);
#   - $TEST_TMPDIR exists and starts empty;
#   - the command runs in $TEST_SRCDIR/$TEST_WORKSPACE.
# Usage: run_test.sh [-l DEST=SRC]... -- COMMAND [ARG]...
set -eu

: "${TEST_SRCDIR:?}" "${TEST_WORKSPACE:?}" "${TEST_TMPDIR:?}"
workspace="${TEST_SRCDIR}/${TEST_WORKSPACE}"
rm -rf "${TEST_SRCDIR}" "${TEST_TMPDIR}"
mkdir -p "${workspace}" "${TEST_TMPDIR}"

while [ $# -gt 0 ]; do
  case "$1" in
    -l)
      dest="${2%%=*}"
      src="${2#*=}"
      if [ "${dest}" = "." ]; then
        rmdir "${workspace}"
        ln -s "${src}" "${workspace}"
      else
        mkdir -p "$(dirname "${workspace}/${dest}")"
        ln -s "${src}" "${workspace}/${dest}"
      fi
      shift 2
      ;;
    --)
      shift
      break
      ;;
    *)
      echo "run_test.sh: unexpected argument '$1'" >&2
      exit 2
      ;;
  esac
done

cd "${workspace}"
exec "$@"
