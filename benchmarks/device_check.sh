#!/usr/bin/env bash
# The accelerator checks in one command, for a GPU machine lent for about 15 minutes
# (one call of at most 10 minutes; the machine's image already has torch with CUDA,
# gpytorch, linear_operator, numba and scipy, and nothing can be installed there).
#
#   bash benchmarks/device_check.sh            # on the device machine, from the repo root
#
# 1. The CUDA tests: tests/test_devices.py (every device path against the CPU) and the
#    operator suites, which then also run on the accelerator's host build of torch.
# 2. benchmarks/bench_device.py at the issue's sizes, accelerator rows first, stopped
#    after $BENCH_BUDGET seconds (default 390). Rows are written as they finish, so a
#    cut-off run keeps what it measured; to resume in a second call, copy the returned
#    device.json to .device_results/device.json (git-ignored; name it in the call's
#    carry) and the finished rows are skipped.
#
# Everything lands in $OUT (the device tool's return folder; /tmp/device_check here):
# gpu.txt, versions.txt, tests.log, bench.log, device.json.
#
# Dependencies the machine's image lacks (pymetis, for the sparse factors above 10^4
# training points) travel as wheels in .device_wheels/ (git-ignored; name it in the
# call's carry); fetch them here once with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d .device_wheels pymetis
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python3}
if compgen -G ".device_wheels/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/device_site .device_wheels/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/device_site"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
"$PYTHON" - >"$OUT/versions.txt" 2>&1 <<'EOF'
import importlib, importlib.util, torch, gpytorch, linear_operator, numba, scipy, numpy
pymetis = importlib.import_module("pymetis") if importlib.util.find_spec("pymetis") else None
print({"torch": torch.__version__, "cuda": torch.version.cuda, "gpytorch": gpytorch.__version__,
       "pymetis": pymetis.version if pymetis else "missing (see .device_wheels above)",
       "linear_operator": linear_operator.__version__, "numba": numba.__version__,
       "scipy": scipy.__version__, "numpy": numpy.__version__,
       "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None})
EOF

timeout "${TEST_BUDGET:-150}" "$PYTHON" -m pytest -q -p no:cacheprovider -rs \
    tests/test_devices.py tests/operators 2>&1 | tee "$OUT/tests.log"
tests_status=${PIPESTATUS[0]}

if [ -f .device_results/device.json ]; then
    cp .device_results/device.json "$OUT/device.json"
fi
timeout "${BENCH_BUDGET:-390}" "$PYTHON" benchmarks/bench_device.py --json-out "$OUT/device.json" \
    --cache-dir /tmp/gp_couple_bench_device "$@" 2>&1 | tee "$OUT/bench.log"
bench_status=${PIPESTATUS[0]}

echo "tests exit status: $tests_status; benchmark exit status: $bench_status (124: stopped at its budget)"
[ "$tests_status" -eq 0 ]
