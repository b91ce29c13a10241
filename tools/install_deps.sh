#!/usr/bin/env bash
# Installs the Debian 12 packages the build needs, only those missing (quick when all are
# present). Sourced or run by tools/test and tools/demo.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java build-essential
  libtorch-dev libgloo-dev
  libabsl-dev libprotobuf-dev protobuf-compiler
  libgoogle-glog-dev libgflags-dev libgtest-dev libgmock-dev
  cmake
  iproute2  # ip netns, veth: tests/distributed/multinode_test.sh
  slurmd slurmctld slurm-client munge  # a private SLURM for tests/distributed/srun_test.sh
  clang-14 libclang-rt-14-dev ccache  # libFuzzer, ASan, UBSan: tools/fuzz.sh (ccache keeps it quick)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "installing missing packages: ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

