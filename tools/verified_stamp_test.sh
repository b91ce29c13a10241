#!/usr/bin/env bash
# tools/verified_stamp.sh on a scratch git checkout: a written stamp matches the inputs it was
# written for; a changed source, a new untracked file or another phase's stamp does not match;
# a changed doc, Markdown file or ignored file still matches.
#   tools/verified_stamp_test.sh tools/verified_stamp.sh
set -euo pipefail
script=$(realpath "$1")
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/stamp.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
git init -q .
mkdir -p tools docs src
cp "$script" tools/verified_stamp.sh
echo "int f();" >src/a.h
echo "# doc" >docs/guide.md
echo "build/" >.gitignore
git add -A && git -c user.email=t@t -c user.name=t commit -qm init
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect() {  # want (match|differ), what
  local got=differ
  tools/verified_stamp.sh matches fuzz >/dev/null && got=match
  if [[ "$got" == "$1" ]]; then echo "ok: $2: $got"; else fail "$2: $got, want $1"; fi
}
expect differ "no stamp yet"
tools/verified_stamp.sh write fuzz "$(tools/verified_stamp.sh fingerprint fuzz)" \
  "fuzz.sh: 1 targets, 0 failed"
expect match "the stamp just written"
[[ "$(tools/verified_stamp.sh matches fuzz)" == "fuzz.sh: 1 targets, 0 failed (recorded "* ]] ||
  fail "summary line: $(tools/verified_stamp.sh matches fuzz)"
echo "more" >>docs/guide.md
echo "# notes" >NOTES.md
mkdir -p build && echo "object" >build/a.o
expect match "a doc, a Markdown file and an ignored file changed"
echo "int g();" >>src/a.h
expect differ "a tracked source changed"
git checkout -q src/a.h
expect match "the source restored"
echo "int h();" >src/b.h
expect differ "an untracked source added"
rm src/b.h
tools/verified_stamp.sh matches consumers >/dev/null && fail "consumers matched fuzz's stamp"
cp tools/verified/fuzz.stamp tools/verified/consumers.stamp
if tools/verified_stamp.sh matches consumers >/dev/null; then
  fail "fuzz's fingerprint matched for consumers"
else
  echo "ok: a stamp copied to another phase does not match"
fi
((failures == 0)) && echo "verified_stamp: all checks passed"
exit $((failures > 0))
