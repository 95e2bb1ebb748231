#!/usr/bin/env bash
# The main job without a GPU, from a clean clone (README, "Start here"): installs torch 2.11 when it is
# missing, builds the PyTorch package kvrope_torch (4-5 minutes on 2 cores; its compile steps are
# printed as they finish), then runs the static-cache example on the CPU, which checks kvrope's
# forward and backward against plain PyTorch (a few seconds).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# (numpy too: torch warns "Failed to initialize NumPy" at every import without it)
if ! python3 -c "import torch, numpy" 2> /dev/null; then
  echo "quickstart: installing torch 2.11 and numpy (about 2.7 GB with torch's CUDA packages)"
  python3 -m pip install "torch==2.11.0" numpy pytest wheel
fi
if ! python3 -c "import kvrope_torch" 2> /dev/null; then
  echo "quickstart: building kvrope_torch (4-5 minutes on 2 cores)"
  python3 -m pip install --no-build-isolation --no-deps -v ./python 2>&1 |
    grep --line-buffered -E '\[[0-9]+/[0-9]+\]|^Successfully|[Ee]rror' |
    sed -u -E 's#^ *(\[[0-9]+/[0-9]+\]).* -c (/[^ ]+) .*#\1 \2#; s#^(\[[0-9]+/[0-9]+\]) .*/python/#\1 python/#' || true
  python3 -c "import kvrope_torch" || { echo "quickstart: the package did not build (run the pip line above by hand)"; exit 1; }
fi
python3 python/examples/static_cache_attention.py --device cpu
