#!/usr/bin/env bash
# Set up (CPU torch first) and run the demo on a built-in heterogeneous example; no GPU needed.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e .
hexhelix demo "$@"
