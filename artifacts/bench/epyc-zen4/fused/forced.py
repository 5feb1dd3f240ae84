"""Export SmolLM2-135M with one integer-kernels build forced (no race) and, with FUSE=0, without the sibling
calls (exporter.siblings), for steps.py's comparison of each change alone.

python -P forced.py BUILD FUSE OUT QUANT   (BUILD: tiles or one-tile; FUSE: 1 or 0; QUANT: int8 or int4)"""

import sys

from exporter import export, quant_family
from exporter.cli import main

build, fuse, out, quant = sys.argv[1:5]
quant_family.BUILDS = {build: build == "one-tile"}
quant_family.KNOWN_GOOD_BUILD = build
if fuse == "0":
    export.fuse_siblings = lambda exported: 0
sys.exit(main(["export", "smollm2-135m", "--out", out, "--quantize", quant, "--max-cache-len", "2048", "--force"]))
