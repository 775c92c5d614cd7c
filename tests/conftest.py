"""Test-session setup that must happen before any test module imports triton."""

import os
import shutil

import pytest
import torch

# Without a GPU, Triton kernels run in its interpreter on CPU tensors. Triton reads this variable when it
# is first imported, and any module (transformers, quant.kernels) may import it first: set it here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (`make test` runs one worker per core) each worker keeps to its share of the cores: torch's
# default of one thread per core in every worker would oversubscribe them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


# The GPU markers, defined once: a test marked `gpu` needs a CUDA device; one marked `cuda_kernels` also needs the
# project's CUDA kernels to build (an sm_80+ GPU and nvcc). Unmarked tests run everywhere (CI: 2 CPU cores).
HAS_GPU = torch.cuda.is_available()
HAS_CUDA_KERNELS = HAS_GPU and torch.cuda.get_device_capability()[0] >= 8 and shutil.which("nvcc") is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    config.addinivalue_line("markers", "cuda_kernels: needs a CUDA GPU (sm_80+) and nvcc to build the CUDA kernels")


def pytest_collection_modifyitems(config, items):
    skips = {
        "gpu": (HAS_GPU, "needs a CUDA GPU"),
        "cuda_kernels": (HAS_CUDA_KERNELS, "needs a CUDA GPU (sm_80+) and nvcc to build the CUDA kernels"),
    }
    for item in items:
        for name, (available, reason) in skips.items():
            if not available and item.get_closest_marker(name):
                item.add_marker(pytest.mark.skip(reason=reason))
