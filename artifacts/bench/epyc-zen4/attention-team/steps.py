"""A bundle's decode graphs at 1 and 8 rows called directly, alternating (20 steps each, 10 times), every row at
one position; run under ops.so (ops.cpp) to time the custom ops inside them, then `--report` the file it wrote:
ms a step of each op, by rows.

    SHIM_OUT=ops.tsv LD_PRELOAD=./ops.so python steps.py BUNDLE [POSITION] && python steps.py --report ops.tsv"""

import collections
import statistics
import sys
import time

ROUNDS, STEPS = 10, 20


def run(path: str, position: int) -> None:
    import torch

    from runtime import load
    from runtime.model.positions import RowPositions

    rt = load(path)

    def binder(batch):
        rows = RowPositions(batch, rt.contract.max_cache_len, rt.contract.device)
        rows.place(slice(0, batch), torch.ones(batch, position + 1, dtype=torch.long), position)
        rows.advance(torch.ones(batch, dtype=torch.bool))
        pos, index, mask = rows.inputs(batch)
        step = rt.decode.bind(torch.full((batch, 1), 17), pos, index, [t[:batch] for t in rt.kv])
        return lambda: step(mask)

    steps, times = {1: binder(1), 8: binder(8)}, {1: [], 8: []}
    with torch.inference_mode():
        for _ in range(ROUNDS):
            for batch, step in steps.items():
                for _ in range(STEPS):
                    start = time.perf_counter()
                    step()
                    times[batch].append(time.perf_counter() - start)
    for batch, t in times.items():
        print(f"{batch} rows: {statistics.median(t) * 1e3:.2f} ms a step, {len(t)} steps")


def report(path: str) -> None:
    total = collections.defaultdict(float)
    for line in open(path):
        key, _, seconds = line.split("\t")
        op, rows, *rest = key.split()
        total[(rows.replace("B", "M"), " ".join([op, *rest[:1]]))] += float(seconds) / (ROUNDS * STEPS) * 1e3
    for rows in sorted({r for r, _ in total}):
        ops = sorted((op, ms) for (r, op), ms in total.items() if r == rows)
        print(rows, " | ".join(f"{op} {ms:.2f}" for op, ms in ops), f"| sum {sum(ms for _, ms in ops):.2f} ms a step")


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(sys.argv[2])
    else:
        run(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 64)
