# Sourced by tests that need a Python package from PyPI:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/pypi_python.sh"
#   pypi_python tensorboard tensorboard_test      # sets $python, or ends the test
#   pypi_python transformers fields_test "$CPPTRAIN_VENV"   # installs there when it must
#   "$installer" "$venv" || pypi_skip_or_fail torchrun_test "torch's torchrun"
#
# pypi_python PACKAGE TEST [VENV]: $python becomes the first Python that imports PACKAGE:
# $CPPTRAIN_VENV's, the system's (GPU hosts have torch, transformers and tensorboard, and reach
# no PyPI), or VENV's (default $TEST_TMPDIR/venv) after installing it there. When an install
# fails, pypi_skip_or_fail ends the test: SKIPPED (exit 0) if pypi.org cannot be reached, FAIL
# (exit 1) if it can, since then the install itself is broken.
pypi_skip_or_fail() {
  local test="$1" what="$2"
  if ! python3 -c 'import socket; socket.create_connection(("pypi.org", 443), 5)' 2>/dev/null; then
    echo "SKIPPED: $test: no $what here and PyPI cannot be reached"
    exit 0
  fi
  echo "FAIL: $test: cannot install $what from PyPI"
  exit 1
}

pypi_python() {
  local package="$1" test="$2" candidate
  for candidate in "${CPPTRAIN_VENV:-/nonexistent}/bin/python" python3; do
    if "$candidate" -c "import $package" 2>/dev/null; then
      python="$candidate"
      return 0
    fi
  done
  local venv="${3:-${TEST_TMPDIR:?}/venv}"
  [[ -x "$venv/bin/pip" ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$package" ||
    pypi_skip_or_fail "$test" "the $package package"
  python="$venv/bin/python"
}
