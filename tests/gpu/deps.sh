#!/usr/bin/env bash
# Make PYTHON (default python3) able to render projects: copier, typer, yaml, tqdm, pytest.
# Installs nothing when they import already. Otherwise installs the wheels in .whl/ without
# reaching a registry (a GPU machine may have no network), or from PyPI when there is no .whl/.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${1:-${PYTHON:-python3}}
if "$PYTHON" -c 'import copier, typer, yaml, tqdm, pytest' 2>/dev/null; then
    exit 0
fi
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install --quiet --no-index --no-deps .whl/*.whl
else
    "$PYTHON" -m pip install --quiet "copier>=9.6,<10" "typer>=0.12" "pyyaml>=6" "tqdm>=4.60" "pytest>=8"
fi
"$PYTHON" -c 'import copier, typer, yaml, tqdm, pytest' || {
    echo "deps.sh: copier and its dependencies are still missing; see ../shared/gpu.md" >&2
    exit 1
}
