#!/bin/bash
# abproc.sh ROUNDS BUNDLE...: each bundle in its own process, in turn, ROUNDS times (ms/token at 1 stream)
R=$1; shift
for r in $(seq $R); do for b in "$@"; do python $(dirname $0)/../int8/one_vs_one.py $b 2>&1 | tail -1; done; done
