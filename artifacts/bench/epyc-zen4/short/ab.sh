#!/bin/bash
# The engine A/B behind engine-ab.txt: one bundle (BUNDLE), the checkout before (OLD, a worktree) and this one
# (NEW), one process each, interleaved, 1 and 8 streams, 3 rounds; the last of gap8.py's three runs each.
# bash ab.sh BUNDLE OLD NEW
here=$(cd "$(dirname "$0")" && pwd)
for round in 1 2 3; do
  for tree in "$2" "$3"; do
    for n in 1 8; do
      echo "$tree n=$n $(PYTHONPATH=$tree python "$here/gap8.py" "$1" "$n" 2>/dev/null | tail -1)"
    done
  done
done
