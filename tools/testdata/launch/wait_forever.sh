#!/bin/sh
# A rank for //tools:launcher_test that runs until it is killed. It starts a child, writes its
# own pid to DIR/pid.$RANK and the child's to DIR/child.$RANK, prints "ready", and waits.
#
#   wait_forever.sh DIR               # SIGTERM ends it
#   wait_forever.sh DIR ignore-term   # it and its child ignore SIGTERM: only SIGKILL ends it
#   wait_forever.sh DIR trap-term     # on SIGTERM it writes DIR/term.$RANK and exits 0
set -e
dir=$1
case "$2" in
  ignore-term) trap '' TERM ;;
  trap-term) trap 'echo term > "$dir/term.$RANK"; exit 0' TERM ;;
esac
sleep 100000 &
# Written then renamed, so a reader never sees a half-written pid.
echo $! > "$dir/child.$RANK.tmp" && mv "$dir/child.$RANK.tmp" "$dir/child.$RANK"
echo $$ > "$dir/pid.$RANK.tmp" && mv "$dir/pid.$RANK.tmp" "$dir/pid.$RANK"
echo ready
wait
