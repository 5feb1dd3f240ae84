#!/bin/bash
# the streams worker on each bundle in turn: b8 (8 adjacent rows a micro-tile, b5f6f0d), b8r (runs, ac7ff40), b8p (runs, two rows a 512-bit vector, the tuner's noise rule)
. /work/main/.venv/bin/activate
cd /work/main
for r in ${ROUNDS:-1 2}; do for dt in float32 bfloat16; do for t in b8 b8r b8p; do
  python -m exporter.bench.streams --path /work/exp/$t-$dt --streams 8 --prompt-len 32 --new-tokens 64 --long-prompt 512 --chunk 32 --budget 1 --threads 2 > /work/exp/ab3-$t-$dt-$r.json 2>/work/exp/ab3-$t-$dt-$r.err
  python /work/exp/show.py /work/exp/ab3-$t-$dt-$r.json "$t-$dt round $r"
done; done; done
