#!/bin/bash
# swap.sh BUNDLE NAME [flags]: a copy of BUNDLE (hard links) at BUNDLE-NAME whose kernels.so is built with
# flags (build.sh), under the same soname, the manifest's hash of it rewritten: one graph, two kernel builds
set -e
B=$1; NAME=$2; shift 2
D=$B-$NAME; rm -rf $D; mkdir $D
for f in $B/*; do ln $f $D/; done
rm $D/kernels.so $D/manifest.json; cp $B/manifest.json $D/
SONAME=$(python3 -c "import json;print(json.load(open('$B/manifest.json'))['native']['soname'])")
mkdir -p /tmp/sw && $(dirname $0)/build.sh /tmp/sw/$SONAME "$@" 2>/dev/null && cp /tmp/sw/$SONAME $D/kernels.so
python - <<PY
import json, hashlib, sys
sys.path.insert(0, "tests")
from pathlib import Path
from helpers import rewrite_manifest
d = Path("$D"); raw = json.loads((d / "manifest.json").read_text())
files = dict(raw["files"]); files["kernels.so"] = hashlib.sha256((d / "kernels.so").read_bytes()).hexdigest()
rewrite_manifest(d, files=files)
PY
echo $D
