"""Each decode graph of a bundle called directly (ms, median of 20) at context 64, as the streams bench
times them. One process per bundle (two bundles' kernels share a soname). Run from the repository root:
python artifacts/bench/intel/amx/steps.py BUNDLE 1,2,4,8"""

import json
import sys

import runtime
from exporter.bench.worker import direct_step_ms

rt = runtime.load(sys.argv[1])
batches = [int(b) for b in sys.argv[2].split(",")]
print(json.dumps({b: round(direct_step_ms(rt, 64, batch=b), 2) for b in batches}))
