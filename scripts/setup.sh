#!/usr/bin/env bash
# Installs Collage's core and every backend plugin that can run on this machine, with test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --upgrade pip
python3 -m pip install "torch==2.13.0"
python3 -m pip install -e ".[test]" -e plugins/tvm -e plugins/onnxruntime
collage backends
