"""Per layer call of each decode attention candidate on Gemma 3 270M's attention shape (1 KV head, 4 query
heads, head size 256), compiled as an export compiles them and timed interleaved (exporter.attention._seconds),
at 1 and 8 rows over 97, 1,024 and 2,048 cached slots, fp32 and bf16. Run: python layer.py"""

import json
import sys

import torch

from exporter import attention, kernels

kernels.build(log=lambda _: None)
torch.set_num_threads(2)
out = []
for dtype in (torch.float32, torch.bfloat16):
    names = (attention.FLASH, attention.GROUPED, attention.NATIVE)
    for rows in (1, 8):
        for span in (97, 1024, 2048):
            q = torch.randn(rows, 4, 1, 256).to(dtype)
            k, v = (torch.randn(rows, 1, span, 256).to(dtype) for _ in range(2))
            mask = torch.ones(rows, 1, 1, span, dtype=torch.bool)
            us = {n: round(s * 1e6, 1) for n, s in attention._seconds(names, [[(q, k, v, mask)]], {}).items()}
            row = {"dtype": str(dtype).split(".")[-1], "rows": rows, "slots": span, "us": us}
            print(json.dumps(row), flush=True)
            out.append(row)
json.dump(out, open(sys.argv[1] if len(sys.argv) > 1 else "layer.json", "w"), indent=1)
