#!/bin/bash
. /work/main/.venv/bin/activate
cd /work/main
for r in ${ROUNDS:-1 2}; do for t in base new; do
  python -m exporter.bench.streams --path /work/exp/b8-$t --streams 8 --prompt-len 32 --new-tokens 64 --long-prompt 512 --chunk 32 --budget 1 --threads 2 > /work/exp/ab-$t-$r.json 2>/work/exp/ab-$t-$r.err
  python - <<PY
import json; m = json.load(open("/work/exp/ab-$t-$r.json"))
print("$t round $r", {k: (round(v,2) if isinstance(v,float) else v) for k, v in m.items() if k not in ("one","many","admission")}, flush=True)
one, many = m["one"], m["many"]
print("   one", round(one["tokens_per_s"],1), round(one["itl_p50_ms"],2), " many", round(many["tokens_per_s"],1), round(many["itl_p50_ms"],2), " gain", round(many["tokens_per_s"]/one["tokens_per_s"],2), "itl", round(many["itl_p50_ms"]/one["itl_p50_ms"],2), " admission", [round(a["p99_over_p50"],2) for a in m["admission"]], flush=True)
PY
done; done
