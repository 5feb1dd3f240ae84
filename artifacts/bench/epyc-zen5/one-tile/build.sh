#!/bin/bash
# build.sh OUT.so [extra flags]: the kernels as exporter/kernels.py builds them (run from the repository
# root with its venv active), from $SRC (default exporter/csrc; the variants measured here were an edited
# copy with -DAOTPACK_T1=n / -DAOTPACK_NOFETCH switches, now -DAOTPACK_ONE_TILE in the sources)
OUT=$1; shift
INC=$(python -c "from torch.utils import cpp_extension as c; print(' '.join('-I'+p for p in c.include_paths()))")
LIB=$(python -c "from torch.utils import cpp_extension as c; print(' '.join('-L'+p for p in c.library_paths()))")
S=${SRC:-exporter/csrc}
g++ -O3 -std=c++17 -fPIC -shared -fopenmp -ffp-contract=off -Wall -march=native "$@" $INC $S/quant_common.cpp $S/int8.cpp $S/int4.cpp $S/dense.cpp -o $OUT -Wl,-soname,$(basename $OUT) $LIB -ltorch_cpu -lc10
