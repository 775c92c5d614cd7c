"""Test-session setup that must happen before any test module imports triton."""
import os

import torch

# Without a GPU, Triton kernels run in its interpreter on CPU tensors. Triton reads this variable when it
# is first imported, and any module (transformers, quant.kernels) may import it first: set it here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
