#!/bin/bash
. /work/main/.venv/bin/activate
B=${B:-/work/exp/b8n-int8}
for r in 1 2; do for tree in new old; do
  d=/work/main; [ $tree = old ] && d=/work/exp/old2
  cd $d && python -m exporter.bench.streams --path $B --streams 8 --prompt-len 32 --new-tokens 64 --long-prompt 512 --chunk 32 --budget 1 --threads 2 > /work/exp/adm-$tree-$r.json 2>/work/exp/adm-$tree-$r.err
  python /work/exp/show.py /work/exp/adm-$tree-$r.json "$tree round $r"
done; done
