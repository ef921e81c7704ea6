#!/usr/bin/env bash
# Generated trainer vs the hand-written DDP reference loop on one CUDA GPU (bf16, a larger MLP):
# samples/s and achieved TFLOP/s side by side. Under 5 minutes on a recent GPU.
#
#   bash bench/gpu.sh                      # defaults: MLP 1024-4096x8-10, batch 256 x 4, 3 rounds
#   bash bench/gpu.sh --repeats 5 --hidden-dim 8192    # any flag of `python -m bench.gpu --help`
#
# Needs: an NVIDIA GPU, and a Python with the CUDA build of torch (set PYTHON=/path/to/python to
# pick one). It installs nothing but ddp-new's own small dependencies, from PyPI with pip, and
# only when they are missing; torch is never installed or upgraded here.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "bench/gpu.sh: nvidia-smi not found; this benchmark needs an NVIDIA GPU" >&2
    echo "  (to smoke-test the script on CPU: $PYTHON -m bench.gpu --device cpu --tiny)" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "bench/gpu.sh: $PYTHON has no CUDA-enabled torch; install the CUDA build of torch first" >&2
    exit 1
fi
# What rendering a project and running its trainer need besides torch (see pyproject.toml).
if ! "$PYTHON" -c 'import copier, typer, yaml, tqdm' 2>/dev/null; then
    "$PYTHON" -m pip install --quiet "copier>=9.6,<10" "typer>=0.12" "pyyaml>=6" "tqdm>=4.60"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name())'
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m bench.gpu --device cuda "$@"
