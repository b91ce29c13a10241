#!/usr/bin/env bash
# Checks the one-way arrows between rooms (docs/ARCHITECTURE.md, "Rooms and arrows") by the
# includes of each room's files:
#   kernels/    includes no project header outside kernels/ and base/
#   module/     includes only module/ (and system headers)
#   sharding/   includes no models/, engines/, checkpoint/, trainer/ header
#   checkpoint/ includes no engines/ or trainer/ header
#   models/     includes no sharding/, engines/, checkpoint/, trainer/ header
#   engines/    includes no checkpoint/ or trainer/ header
#   generation/ includes no sharding/, engines/, checkpoint/, trainer/, jobs/ header (models/ only)
#   jobs/       includes no trainer/ or generation/ header
#   trainer/    includes no jobs/ or generation/ header
#   checkpoint/ and trainer/ library code include no models/decoder.h: they know a model as
#               TrainableModel (its ConfigProto), not the reference decoder (tests, their
#               *_testing.h helpers and testing/ may build one)
#   and no room below tools/ includes a tools/ header
# Usage: tools/check_layering.sh [ROOT]. Exit 0 when every arrow holds, 1 listing the
# offending lines otherwise.
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$root"
status=0
forbid() {  # room, pattern of forbidden include paths
  local room=$1 pattern=$2 hits
  hits=$(grep -rnE "^#include \"($pattern)/" --include='*.h' --include='*.cc' "$room" || true)
  if [[ -n "$hits" ]]; then
    echo "check_layering: $room/ must not include ($pattern)/:"
    echo "$hits"
    status=1
  fi
}
forbid kernels 'config|proto|module|sharding|engines|models|checkpoint|trainer|generation|jobs|tools|tests'
forbid module 'base|config|proto|sharding|engines|models|checkpoint|trainer|generation|jobs|tools|tests'
forbid sharding 'models|engines|checkpoint|trainer|generation|jobs|tools'
forbid checkpoint 'engines|trainer|generation|jobs|tools'
forbid models 'sharding|engines|checkpoint|trainer|generation|jobs|tools'
forbid engines 'checkpoint|trainer|generation|jobs|tools'
forbid generation 'sharding|engines|checkpoint|trainer|jobs|tools'
forbid jobs 'trainer|generation|tools'
forbid trainer 'generation|jobs|tools'
# library <room> <header>: no file of the room outside its tests includes the header.
library_forbids() {
  local room=$1 header=$2 hits
  hits=$(grep -rnF "#include \"$header\"" --include='*.h' --include='*.cc' "$room" |
    grep -vE '(_test\.cc|_testing\.h|/testing/[^:]*):' || true)
  if [[ -n "$hits" ]]; then
    echo "check_layering: $room/ library code must not include $header:"
    echo "$hits"
    status=1
  fi
}
library_forbids checkpoint models/decoder.h
library_forbids trainer models/decoder.h
[[ $status -eq 0 ]] && echo "check_layering: OK: every room includes only the rooms below it"
exit $status
