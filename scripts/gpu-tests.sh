#!/usr/bin/env bash
# Runs every GPU test (marked `gpu`) from a clean checkout on a machine with an NVIDIA GPU:
# the cuBLAS, cuDNN and CUTLASS kernels against PyTorch on CUDA (CUTLASS's on a Hopper only), and the shipped models placed over TVM,
# cuBLAS and cuDNN, replaying CUDA graphs and exported to a tar that loads in a new process; Inductor's regions on CUDA,
# TVM's kernels tuned for CUDA (tvm-tuned), and a CUDA placement measured through TVM's RPC (tornado: collage-core[rpc]). Needs what ./scripts/setup.sh installs plus NVIDIA's libraries (PyTorch's CUDA
# wheels bring cuBLAS, cuDNN, NVRTC and the CUDA runtime; add nvidia-cudnn-frontend) and g++.
#
#   ./scripts/gpu-tests.sh [pytest options]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/tvm -e plugins/cublas -e plugins/cudnn -e plugins/cutlass
python3 -m pip install -q --no-deps --no-build-isolation -e plugins/inductor -e plugins/metaschedule 2>/dev/null || true
python3 -m pip install -q --no-deps --no-build-isolation -e plugins/onnxruntime -e plugins/dnnl 2>/dev/null || true
python3 -m collage_core backends
# The kernel tests (cuBLAS's, cuDNN's, TVM's short-row schedules) check numerics only, so with pytest-xdist installed they run eight at once.
parallel=()
python3 -c "import xdist" 2>/dev/null && parallel=(-n 8)
status=0
python3 -m pytest -q --run-gpu -m gpu -p no:cacheprovider "${parallel[@]}" plugins/cublas/tests plugins/cudnn/tests plugins/tvm/tests "$@" || status=$?
# CUTLASS kernels compile with nvcc (a minute or two each): all the tests' kernels at once and in parallel first,
# then the tests in one process, which find them built.
python3 plugins/cutlass/tests/gpu_test_kernels.py || status=$?
python3 -m pytest -q --run-gpu -m gpu -p no:cacheprovider plugins/cutlass/tests "$@" || status=$?
python3 -m pytest -q --run-gpu -m gpu -p no:cacheprovider tests/test_cuda_graphs.py tests/test_gpu_placements.py tests/test_gpu_faults.py tests/test_mlf.py tests/test_remote.py "$@" || status=$?
python3 -m pytest -q --run-gpu -m gpu -p no:cacheprovider plugins/inductor/tests plugins/metaschedule/tests "$@" || status=$?
exit $status
