#!/usr/bin/env bash
# GPU check on a CUDA machine, from a checkout of this repository, in a few minutes: the GPU
# tests generate projects and train them with nccl on every visible GPU in bf16 and fp16, and
# run the generated project's own gpu-marked tests. Works offline (see tests/gpu/deps.sh);
# the checkout is put on PYTHONPATH, not installed; torch is never installed here.
#
#   bash tests/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}

nvidia-smi -L
if ! "$PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "tests/gpu/run.sh: $PYTHON has no CUDA-enabled torch; install the CUDA build first" >&2
    exit 1
fi
bash tests/gpu/deps.sh "$PYTHON"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.device_count(), "GPU(s)")'
"$PYTHON" -m pytest -q -m gpu -rs tests/test_gpu.py "$@"
