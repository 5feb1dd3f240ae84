"""One stream, then 8, three rounds in turn on one bundle (the bench's side_by_side, 32-token prompts, 64 new
tokens): each round's gain and ITL growth. python sbs.py BUNDLE (PYTHONPATH picks the checkout)"""

import json
import sys

import torch

from exporter.bench.streams import _prompts, side_by_side
from runtime import load

torch.set_num_threads(2)
rt = load(sys.argv[1])
prompts = _prompts(32000, 8, 32)
side_by_side(rt, prompts[:2], 8)  # warm-up
r = side_by_side(rt, prompts, 64)
print(
    json.dumps(
        {
            "gains": [round(g, 2) for g in r["rounds_gain"]],
            "growths": [round(g, 2) for g in r["rounds_itl_growth"]],
            "one_itl": round(r["one"]["itl_p50_ms"], 2),
            "many_itl": round(r["many"]["itl_p50_ms"], 2),
        }
    )
)
