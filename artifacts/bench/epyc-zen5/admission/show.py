import json, sys
m = json.load(open(sys.argv[1])); one, many = m["one"], m["many"]
graphs = {k: v for k, v in m.items() if k not in ("one", "many", "admission")}
print(sys.argv[2], {k: (round(v, 2) if isinstance(v, float) else v) for k, v in graphs.items()}, flush=True)
print("   one", round(one["tokens_per_s"], 1), round(one["itl_p50_ms"], 2), " many", round(many["tokens_per_s"], 1), round(many["itl_p50_ms"], 2), " gain", round(many["tokens_per_s"] / one["tokens_per_s"], 2), "itl", round(many["itl_p50_ms"] / one["itl_p50_ms"], 2), " admission", [round(a["p99_over_p50"], 2) for a in m["admission"]], flush=True)
