"""Bundles' decode steps called directly, interleaved in one process, 3 rounds, at positions 100, 500 and 1,500
of a 2,048-slot cache (one row): `python steps.py BUNDLE [BUNDLE ...]` prints ms a step per bundle."""

import sys

from exporter.bench.worker import direct_step_ms
from runtime import load


def main() -> None:
    bundles = {path: load(path) for path in sys.argv[1:]}
    for position in (100, 500, 1500):
        for _ in range(3):
            row = {
                p.rstrip("/").split("/")[-1]: round(direct_step_ms(rt, position, steps=60), 3)
                for p, rt in bundles.items()
            }
            print(position, row)


if __name__ == "__main__":
    main()
