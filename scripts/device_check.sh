#!/usr/bin/env bash
# Run scripts/device_check.py on the lent GPU machine: install the wheels sent along (.device_wheels/, made by
# scripts/build_device_wheels.sh and carried with the device tool's `carry`), then run the check into $OUT.
#
# The machine's own python3 holds torch 2.11 and transformers 5.17, below our transformers>=5.24 pin, and it has no
# network: the newer packages come as wheels, installed with --no-index into a folder of their own that PYTHONPATH
# puts in front of the image's site-packages. eagle3_hf itself is imported from this checkout.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/device_check.sh [device_check.py arguments...]

Installs .device_wheels/*.whl (if any) into /tmp/eagle3_site, then runs
    python3 scripts/device_check.py --output-dir "${OUT:-runs/device_check}" ARGS...
and tees its output to device_check.log there. See docs/cuda.md for the device tool call.
Environment: OUT (output folder), PYTHON (default python3), EAGLE3_DEVICE_WHEELS (default .device_wheels).
USAGE
}
case "${1:-}" in
    -h | --help)
        usage
        exit 0
        ;;
esac

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEELS="${EAGLE3_DEVICE_WHEELS:-.device_wheels}"
SITE=/tmp/eagle3_site
OUT_DIR="${OUT:-runs/device_check}"
mkdir -p "$OUT_DIR"

if compgen -G "$WHEELS/*.whl" >/dev/null; then
    began=$(date +%s)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    echo "installed $(ls "$WHEELS" | tr '\n' ' ')in $(($(date +%s) - began)) s"
else
    echo "no wheels in $WHEELS: using the image's packages as they are"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

"$PYTHON" -c 'import sys, torch, transformers; print(sys.executable, "torch", torch.__version__, "transformers",
transformers.__version__, "from", transformers.__file__, "cuda", torch.cuda.is_available())'
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv || true
fi

"$PYTHON" scripts/device_check.py --output-dir "$OUT_DIR" "$@" 2>&1 | tee "$OUT_DIR/device_check.log"
