#!/usr/bin/env bash
# Checks that the CMake build and the Bazel build name the same source files.
#
# Usage: tools/check_build_sync.sh [ROOT]
#   ROOT defaults to the directory above this script (the repository root, or the workspace
#   directory of a Bazel runfiles tree).
#
# Compares
#   - every .cc/.cpp/.cu/.h/.hpp/.cuh named in srcs/hdrs/textual_hdrs of a cc_library, cc_binary
#     or cc_test, every .proto in srcs of a proto_library and every .cu/.cuh in srcs of a
#     filegroup (Bazel has no CUDA rule here; CMake compiles them), in ROOT/**/BUILD.bazel
#   - with every such path written in ROOT/CMakeLists.txt (comments ignored; paths there are
#     relative to the repository root, e.g. module/batch.h).
# Exit status: 0 when both name the same files, 1 when not (the offenders are listed), 2 on a
# usage error or when a BUILD file uses glob() for sources (list them explicitly instead).
#
# fuzz/ (libFuzzer targets, built with clang by tools/fuzz.sh) is in neither build, so it is
# not compared; the project sources those targets compile come from `bazel query` of BUILD
# targets, which this check already covers.
# Skipped: bazel-* output links, hidden directories, directories named testdata (checker
# fixtures live there) and nested repositories (a directory holding its own WORKSPACE).

set -euo pipefail

readonly SOURCE_EXT_RE='\.(cc|cpp|cu|cuh|hpp|h|proto)$'

die() {
  echo "check_build_sync: $*" >&2
  exit 2
}

root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
[[ $# -le 1 ]] || die "usage: $0 [ROOT]"
[[ -d "$root" ]] || die "ROOT '$root' is not a directory"
root="${root%/}"
cmake_file="$root/CMakeLists.txt"
[[ -f "$cmake_file" ]] || die "no CMakeLists.txt in '$root'"

# BUILD files, pruning what is not part of this workspace's build. -H: ROOT itself may be a
# symbolic link (CTest's runfiles); files inside a Bazel runfiles tree are links, which -name
# matches as they are.
build_files=()
while IFS= read -r -d '' f; do
  # A nested repository (third_party/rules_cc ...) has a WORKSPACE of its own.
  skip=0
  probe="$(dirname "$f")"
  while [[ "$probe" != "$root" && "$probe" == "$root"/* ]]; do
    if [[ -e "$probe/WORKSPACE" ]]; then
      skip=1
      break
    fi
    probe="$(dirname "$probe")"
  done
  [[ $skip -eq 0 ]] && build_files+=("$f")
done < <(find -H "$root" \
  \( -name 'bazel-*' -o -name '.*' -o -name testdata \) -prune -o \
  \( -name BUILD.bazel -o -name BUILD \) -print0 | sort -z)
[[ ${#build_files[@]} -gt 0 ]] || die "no BUILD.bazel files under '$root'"

# Prints "<path>\t<BUILD file>" for each source named by a C++ or proto rule of one BUILD file.
# Tokenizes the file (strings, identifiers, punctuation) and tracks the rule call and the
# attribute each string belongs to, so one-line and multi-line rules both work.
bazel_sources_of() {
  local build_file="$1" pkg="$2"
  sed -e 's/#.*$//' "$build_file" |
    grep -oE '"[^"]*"|[A-Za-z_][A-Za-z0-9_]*|[][(){}=,:+]' |
    awk -v pkg="$pkg" -v build_file="${build_file#"$root"/}" '
      BEGIN { depth = 0; rule = ""; attr = ""; pending = ""; bad_glob = 0 }
      {
        tok = $0
        if (tok == "(" || tok == "[" || tok == "{") {
          if (tok == "(" && depth == 0) { rule = pending; attr = "" }
          if (tok == "(" && pending == "glob" && want_attr() && rule != "filegroup") { bad_glob = 1 }
          depth++; pending = ""; next
        }
        if (tok == ")" || tok == "]" || tok == "}") {
          depth--; if (depth == 0) { rule = ""; attr = "" }
          pending = ""; next
        }
        if (tok == "=") { if (depth == 1) attr = pending; pending = ""; next }
        if (tok ~ /^"/) {
          if (want_attr()) emit(substr(tok, 2, length(tok) - 2))
          pending = ""; next
        }
        pending = tok
      }
      function want_attr() {
        if (rule == "cc_library" || rule == "cc_binary" || rule == "cc_test")
          return attr == "srcs" || attr == "hdrs" || attr == "textual_hdrs"
        if (rule == "proto_library") return attr == "srcs"
        if (rule == "filegroup") return attr == "srcs"   # CUDA sources only (see emit)
        return 0
      }
      function emit(label,   path) {
        if (label ~ /^@/) return                     # another repository
        if (rule == "filegroup" && label !~ /\.cuh?$/) return
        if (label ~ /^\/\//) {                       # //pkg:file or //pkg/file
          path = substr(label, 3)
          sub(/:/, "/", path); sub(/^\//, "", path)
        } else {
          path = label; sub(/^:/, "", path)
          if (pkg != "") path = pkg "/" path
        }
        print path "\t" build_file
      }
      END {
        if (bad_glob) {
          print "GLOB\t" build_file
        }
      }'
}

bazel_list="$(mktemp)"
cmake_list="$(mktemp)"
trap 'rm -f "$bazel_list" "$cmake_list"' EXIT

glob_offenders=()
for f in "${build_files[@]}"; do
  dir="$(dirname "$f")"
  pkg="${dir#"$root"}"
  pkg="${pkg#/}"
  while IFS=$'\t' read -r path from; do
    if [[ "$path" == GLOB ]]; then
      glob_offenders+=("$from")
    elif [[ "$path" =~ $SOURCE_EXT_RE ]]; then
      printf '%s\t%s\n' "$path" "$from" >>"$bazel_list"
    fi
  done < <(bazel_sources_of "$f" "$pkg")
done

if [[ ${#glob_offenders[@]} -gt 0 ]]; then
  echo "check_build_sync: these BUILD files use glob() in srcs/hdrs; list the files instead:" >&2
  printf '  %s\n' "${glob_offenders[@]}" >&2
  exit 2
fi

# Paths in CMakeLists.txt: repository-relative tokens with a source extension, outside
# comments. Tokens that are absolute or built from variables (${...}/x.pb.h) are not sources.
sed -e 's/#.*$//' "$cmake_file" | tr -s '[:space:]"();' '\n' |
  grep -E "^[A-Za-z0-9_.][A-Za-z0-9_./+-]*${SOURCE_EXT_RE}" |
  sed -e 's|^\./||' | sort -u >"$cmake_list" || true

only_bazel="$(cut -f1 "$bazel_list" | sort -u | comm -23 - "$cmake_list")"
only_cmake="$(cut -f1 "$bazel_list" | sort -u | comm -13 - "$cmake_list")"

if [[ -z "$only_bazel" && -z "$only_cmake" ]]; then
  echo "check_build_sync: OK: ${#build_files[@]} BUILD files and CMakeLists.txt name the same" \
    "$(wc -l <"$cmake_list") source files"
  exit 0
fi

echo "check_build_sync: FAILED: the Bazel and CMake builds name different source files."
if [[ -n "$only_bazel" ]]; then
  echo "In a BUILD file but missing from CMakeLists.txt:"
  while IFS= read -r path; do
    printf '  %s  (%s)\n' "$path" "$(awk -F'\t' -v p="$path" '$1 == p { print $2; exit }' "$bazel_list")"
  done <<<"$only_bazel"
fi
if [[ -n "$only_cmake" ]]; then
  echo "In CMakeLists.txt but missing from every BUILD file (srcs/hdrs of cc_library, cc_binary," \
    "cc_test; srcs of proto_library):"
  while IFS= read -r path; do
    dir="$(dirname "$path")"
    if [[ -e "$root/$dir/BUILD.bazel" || -e "$root/$dir/BUILD" ]]; then
      printf '  %s\n' "$path"
    else
      # Under `bazel test` only the BUILD files given as data are here.
      printf '  %s  (no BUILD file of %s/ was read; under Bazel: is it in the data of' "$path" "$dir"
      printf ' //tests:build_sync_test?)\n'
    fi
  done <<<"$only_cmake"
fi
echo "Add each file to both builds (CMakeLists.txt lists paths from the repository root)."
exit 1
