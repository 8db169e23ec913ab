#!/usr/bin/env bash
# Installs Collage's core and every backend plugin that can run on this machine, with test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
# System packages: oneDNN 2.x and a C++ compiler for the DNNL plugin, Graphviz for `collage show`.
if ! [ -f /usr/include/oneapi/dnnl/dnnl.hpp ] || ! command -v g++ >/dev/null || ! command -v dot >/dev/null; then
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libdnnl-dev g++ graphviz >/dev/null
fi
python3 -m pip install --upgrade pip
python3 -m pip install "torch==2.13.0"
# cuBLAS, cuDNN and CUTLASS install everywhere (their pattern tests need no GPU); they run where there is an NVIDIA GPU.
python3 -m pip install -e ".[test,rpc]" -e plugins/tvm -e plugins/onnxruntime -e plugins/openvino -e plugins/inductor -e plugins/dnnl -e plugins/cublas -e plugins/cudnn -e plugins/cutlass -e plugins/metaschedule
collage backends
