#!/usr/bin/env bash
# Lets tools/test reuse the result of a slow phase (the consumer builds, the fuzz run) when
# nothing it reads has changed since a passing run recorded in tools/verified/<phase>.stamp.
#
#   tools/verified_stamp.sh fingerprint PHASE   prints the phase's input fingerprint
#   tools/verified_stamp.sh matches PHASE       exit 0 when the committed stamp's fingerprint
#                                               equals this checkout's; prints the stamp's
#                                               summary line
#   tools/verified_stamp.sh write PHASE FINGERPRINT LINE
#                                               records a passing run (LINE: its result) in
#                                               tools/verified/PHASE.stamp; FINGERPRINT is
#                                               the one taken before the phase ran
#
# The fingerprint is a SHA-256 over the content of every file of the checkout (tracked, and
# untracked ones git does not ignore) except docs/, Markdown files and tools/verified/, plus
# the versions of the compilers, build tools and LibTorch package that build the phase. So a
# stamp applies only to byte-identical sources built by the same toolchain; any other change
# runs the phase again (and a pass there rewrites the stamp, which is committed with the
# change). CPPTRAIN_FULL=1 makes tools/test run every phase whatever the stamps say.
set -euo pipefail
cd "$(dirname "$0")/.."

stamp_dir=tools/verified

toolchain() {
  local tool
  for tool in gcc clang++-14 cmake bazel; do
    if command -v "$tool" >/dev/null 2>&1; then
      echo "$tool: $("$tool" --version 2>/dev/null | head -1)"
    else
      echo "$tool: missing"
    fi
  done
  echo "libtorch-dev: $(dpkg-query -W -f '${Version}' libtorch-dev 2>/dev/null || echo missing)"
}

fingerprint() {  # phase
  {
    echo "phase $1"
    toolchain
    git ls-files -z --cached --others --exclude-standard -- . ':!docs' ':!*.md' \
      ":!$stamp_dir" | sort -z | xargs -0 -r sha256sum --
  } | sha256sum | cut -c1-64
}

case "${1:-}" in
  fingerprint)
    fingerprint "$2"
    ;;
  matches)
    stamp="$stamp_dir/$2.stamp"
    [[ -f "$stamp" ]] || exit 1
    [[ "$(sed -n 's/^fingerprint //p' "$stamp")" == "$(fingerprint "$2")" ]] || exit 1
    echo "$(sed -n 's/^result //p' "$stamp") (recorded $(sed -n 's/^date //p' "$stamp"))"
    ;;
  write)
    mkdir -p "$stamp_dir"
    tmp="$stamp_dir/.$2.stamp.tmp"
    {
      echo "# Written by tools/test after this phase passed on these exact inputs"
      echo "# (tools/verified_stamp.sh); commit it with the change it verified."
      echo "fingerprint $3"
      echo "date $(date -u +%FT%TZ)"
      echo "result $4"
    } >"$tmp"
    mv "$tmp" "$stamp_dir/$2.stamp"
    ;;
  *)
    echo "usage: tools/verified_stamp.sh fingerprint|matches PHASE," \
      "or write PHASE FINGERPRINT LINE" >&2
    exit 2
    ;;
esac
