#!/usr/bin/env bash
# Set up (CPU torch first, so no multi-GB CUDA wheel is pulled) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[dev]'
python -m pytest -q "$@"
