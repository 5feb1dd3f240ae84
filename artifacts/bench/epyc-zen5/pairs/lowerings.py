import json, sys
for b in sys.argv[1:]:
    m=json.load(open(f"{b}/manifest.json"))
    for g in m["graphs"]:
        print(b.split('/')[-1], "batch", g["batch"], "  ".join(f'{l["rows"]}x{l["cols"]}:{l["chosen"]}' + "(" + ",".join(f"{k[0]}{v:.0f}" for k,v in l["gb_per_s"].items()) + ")" + ("*" if l["noisy"] else "") for l in g["lowerings"]))
