"""The CUDA sources (raw kernels in include/, torch bindings here), shipped inside the package as quant.csrc and
built on first use by quant.kernels.cuda."""
