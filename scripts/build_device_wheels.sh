#!/usr/bin/env bash
# Prepare .device_wheels/ for scripts/device_check.sh: the packages the GPU machine has too old, as wheels for its
# Python 3.12 on x86-64, at the versions installed in this checkout's .venv (what CI tests), without torch.
#
# The machine's image has torch 2.11, transformers 5.17, huggingface_hub 1.33, tokenizers 0.23.2, safetensors 0.8.0
# and accelerate 1.15 (/work/.library/device/KINDS.md). transformers is below our pin, and transformers >= 5.25 needs
# huggingface_hub >= 2.4, which brings new packages of its own (httpx2, httpcore2, truststore) and a newer hf-xet;
# regex is sent too because transformers checks its version at import and the image's is not recorded. Everything
# that travels (the working tree plus these wheels) must stay under 64 MiB.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/build_device_wheels.sh [PACKAGE==VERSION ...]

Downloads transformers, huggingface_hub (with httpx2, httpcore2, truststore, hf-xet) and regex at this .venv's
versions (or the given requirements instead) into .device_wheels/
and checks that the working tree plus the wheels fit the device tool's 64 MiB. Needs PyPI; run it here, not there.
USAGE
}
case "${1:-}" in
    -h | --help)
        usage
        exit 0
        ;;
esac

cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
WHEELS=.device_wheels
LIMIT=$((64 * 1024 * 1024))

if [ "$#" -gt 0 ]; then
    requirements=("$@")
else
    version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
    requirements=()
    for package in transformers huggingface_hub httpx2 httpcore2 truststore hf-xet regex; do
        requirements+=("$package==$(version "$package")")
    done
fi

rm -rf "$WHEELS"
mkdir -p "$WHEELS"
# One version of each package only: two would stop the whole --no-deps install there.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" "${requirements[@]}"

wheels=$(du -cb "$WHEELS"/*.whl | tail -1 | cut -f1)
# What the device tool sends: tracked and untracked-not-ignored files that exist (a tracked file moved out of the way
# for the call does not travel, and du would stop the script on it), NUL-separated.
travelling_files() {
    git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done
}
tree=$(travelling_files | du -cb --files0-from=- | tail -1 | cut -f1)
ls -l "$WHEELS"
echo "wheels $((wheels / 1024)) KiB + working tree $((tree / 1024)) KiB = $(((wheels + tree) / 1024)) KiB" \
    "of $((LIMIT / 1024)) KiB"
if [ $((wheels + tree)) -gt "$LIMIT" ]; then
    echo "over the device tool's 64 MiB: move the largest files aside for the call (docs/cuda.md), e.g." >&2
    travelling_files | du -b --files0-from=- | sort -n | tail -4 >&2
    exit 1
fi
