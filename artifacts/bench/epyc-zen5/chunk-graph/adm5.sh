#!/bin/bash
. /work/main/.venv/bin/activate
cd /work/main
for r in 1 2 3; do for B in cg-int8 b8n-int8; do
  python -m exporter.bench.streams --path /work/exp/$B --streams 8 --prompt-len 32 --new-tokens 64 --long-prompt 512 --chunk 32 --budget 1 --threads 2 > /work/exp/adm5-$B-$r.json 2>/work/exp/adm5-$B-$r.err
  python /work/exp/show.py /work/exp/adm5-$B-$r.json "$B round $r"
done; done
