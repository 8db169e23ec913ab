"""TVM loads without PyTorch in Collage's processes, and PyTorch still imports and exchanges
tensors with TVM afterwards (run in fresh interpreters: this one has PyTorch loaded already)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")


def run_fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_tvm_loads_without_pytorch_and_pytorch_imports_afterwards():
    out = run_fresh(
        "import sys\n"
        "import collage_core.tvm_compat\n"
        "from tvm import relax\n"
        "print('torch' in sys.modules)\n"
        "import numpy as np, torch, tvm_ffi\n"
        "from collage_core.model.torch_deferral import DeferTorch\n"
        "print(any(isinstance(f, DeferTorch) for f in sys.meta_path))\n"
        "x = torch.arange(6, dtype=torch.float32).reshape(2, 3)\n"
        "back = torch.from_dlpack(tvm_ffi.from_dlpack(x))\n"
        "print(bool(torch.equal(back, x)))\n"
    )
    assert out.splitlines() == ["False", "False", "True"]


def test_pytorch_imported_first_is_left_alone():
    out = run_fresh(
        "import sys, torch\n"
        "import collage_core.tvm_compat\n"
        "from collage_core.model.torch_deferral import DeferTorch\n"
        "print(any(isinstance(f, DeferTorch) for f in sys.meta_path))\n"
        "import tvm_ffi._convert as convert\n"
        "print(convert.torch is torch)\n"
    )
    assert out.splitlines() == ["False", "True"]
