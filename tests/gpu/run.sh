#!/usr/bin/env bash
# GPU check on a CUDA machine, from a checkout of this repository, in under 5 minutes:
# installs what is missing (keeps an installed CUDA torch), then runs the GPU tests, which
# generate projects and train them with nccl on every visible GPU in bf16 and fp16, and
# run the generated project's own gpu-marked tests.
#
#   bash tests/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

nvidia-smi -L
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  "$PYTHON" -m pip install -q torch   # the default wheel on Linux is a CUDA build
fi
"$PYTHON" -m pip install -q -e ".[test]"
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.device_count(), "GPU(s)")'
"$PYTHON" -m pytest -q -m gpu -rs tests/test_gpu.py
