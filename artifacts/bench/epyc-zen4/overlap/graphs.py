"""Two or more bundles' decode graphs at 1 and 8 rows, called directly and alternating in one process (every row
at one position; 20 steps a turn, 10 rounds): median ms a step of each.

    python graphs.py NAME=BUNDLE [NAME=BUNDLE ...] [--position P]"""

import statistics
import sys
import time

import torch

from runtime import load
from runtime.model.positions import RowPositions

ROUNDS, STEPS = 10, 20


def binder(rt, batch: int, position: int):
    rows = RowPositions(batch, rt.contract.max_cache_len, rt.contract.device)
    rows.place(slice(0, batch), torch.ones(batch, position + 1, dtype=torch.long), position)
    rows.advance(torch.ones(batch, dtype=torch.bool))
    pos, index, mask = rows.inputs(batch)
    step = rt.decode.bind(torch.full((batch, 1), 17), pos, index, [t[:batch] for t in rt.kv])
    return lambda: step(mask)


def main() -> None:
    args, position = sys.argv[1:], 64
    if "--position" in args:
        at = args.index("--position")
        position = int(args[at + 1])
        args = args[:at] + args[at + 2 :]
    bundles = dict(a.split("=") for a in args)
    steps = {}
    for name, path in bundles.items():
        rt = load(path)
        for batch in (1, 8):
            steps[(name, batch)] = binder(rt, batch, position)
    times = {key: [] for key in steps}
    with torch.inference_mode():
        for _ in range(ROUNDS):
            for key, step in steps.items():
                for _ in range(STEPS):
                    start = time.perf_counter()
                    step()
                    times[key].append(time.perf_counter() - start)
    for (name, batch), t in times.items():
        print(f"{name} {batch} rows: {statistics.median(t) * 1e3:.2f} ms a step")


if __name__ == "__main__":
    main()
