#!/usr/bin/env bash
# fastdiff's GPU check in one call on a bare GPU image (H200: Python 3.12, torch 2.11 + CUDA 13, Triton 3.6,
# transformers, accelerate, safetensors, onnxruntime; no diffusers/tensorrt/xformers; no network).
# Stages, budgets and output: see benchmarks/gpu_check.py (<= 7 minutes in all, compiles included).
#
#   bash benchmarks/gpu_check.sh              # on the GPU machine; rows -> $OUT (or benchmarks/results)
#   bash benchmarks/gpu_check.sh --dry-run    # on a CPU: the same code paths at tiny shapes (CI runs it)
#
# The U-Net stages need diffusers, which the image lacks. Before the run, on a machine with network, put
# its wheel beside this script (never commit it; if benchmarks/wheels/ is git-ignored, name it among the
# paths carried to the GPU machine):
#
#   pip download --no-deps --only-binary=:all: -d benchmarks/wheels "diffusers==0.42.1"
#
# Its dependencies (huggingface-hub, regex, requests, filelock, safetensors, numpy, Pillow,
# importlib_metadata) come with transformers on the image; a missing one shows as a failed U-Net row.
# The kernel stages need nothing but torch and Triton: they load fastdiff/kernels/ standalone.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=()
if [[ "${1:-}" == "--dry-run" ]]; then DRY=(--dry-run); shift; fi
OUT_DIR="${OUT:-benchmarks/results}"
mkdir -p "$OUT_DIR"
export OMP_WAIT_POLICY=PASSIVE
export FASTDIFF_CACHE_DIR="$(mktemp -d /tmp/fastdiff-gpu-check-cache.XXXXXX)"  # plans measured fresh

if [[ ${#DRY[@]} -eq 0 ]]; then
  unset TRITON_INTERPRET
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  if compgen -G "benchmarks/wheels/*.whl" > /dev/null; then
    python -m pip install --no-deps --no-index --quiet benchmarks/wheels/*.whl \
      || echo "wheel install failed: the U-Net stages will report diffusers missing"
  else
    echo "no benchmarks/wheels/*.whl: the U-Net stages will report diffusers missing (see the header)"
  fi
fi

# fastdiff from this source tree without installing it
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

timeout 450 python benchmarks/gpu_check.py "${DRY[@]}" --out "$OUT_DIR" "$@"
status=$?
rm -rf "$FASTDIFF_CACHE_DIR"
echo "gpu_check finished with status $status; rows in $OUT_DIR/gpu_check*.jsonl"
exit $status
