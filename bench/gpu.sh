#!/usr/bin/env bash
# Generated trainer vs hand-written DDP, Accelerate and Fabric on one CUDA GPU (bf16): samples/s,
# TFLOP/s and the share of a bf16 matmul's rate, on launch-bound, compute-bound and GPT-2-shaped
# workloads.
# About 10 minutes on an H200 with 2 rounds.
#
#   bash bench/gpu.sh                          # every workload, every available contender
#   bash bench/gpu.sh --repeats 3 --workloads compute    # any flag of `python -m bench.gpu --help`
#
# Needs an NVIDIA GPU and a Python with the CUDA build of torch (PYTHON=/path/to/python picks
# one). Works offline: it installs nothing from a registry. When copier (which renders the
# project) is missing, it installs the wheels found in .whl/ (see ../shared/gpu.md for the list)
# with --no-index; without them it says what to install. torch is never installed or upgraded.
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
bash tests/gpu/deps.sh "$PYTHON"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name())'
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout, without installing it
"$PYTHON" -m bench.gpu --device cuda "$@"

# The image task (python -m bench.image): the generated trainer vs a hand-written torchvision DDP
# loop and pytorch/examples' imagenet loop, resnet18 at 224 px, batch 128, 8 loader workers, W=1,
# on 2048 generated JPEGs of 300-500 px; bf16 and fp32, channels_last on and off: images/s, and
# where the step goes (data wait, forward+backward, the rest). The first run also measures the
# loader alone (images/s per worker at 1, 2, 4 and 8 workers) and the trainer's data_wait_frac.
# About 10 minutes. SKIP_IMAGE=1 skips it; IMAGE_FLAGS adds flags (python -m bench.image --help).
if [ "${SKIP_IMAGE:-0}" = 1 ]; then
    exit 0
fi
if ! "$PYTHON" -c 'import torchvision' 2>/dev/null; then
    echo "bench/gpu.sh: torchvision does not import in $PYTHON; skipping the image workload" >&2
    exit 0
fi
loader=(--loader-workers "1,2,4,8")
for precision in bf16 fp32; do
    for layout in --channels-last --no-channels-last; do
        echo "== image workload: --precision $precision $layout"
        # shellcheck disable=SC2086  # IMAGE_FLAGS: several flags
        "$PYTHON" -m bench.image --device cuda --precision "$precision" "$layout" --world-sizes 1 \
            --model resnet18 --image-size 224 --batch-size 128 --num-workers 8 --prefetch 2 \
            --min-px 300 --max-px 500 --train-per-class 256 --repeats 2 --warmup 5 --timed 30 \
            "${loader[@]}" ${IMAGE_FLAGS:-}
        loader=(--no-loader)
    done
done
