"""The kernel options of a run as the command line and the environment give them: one reader for `oscar-eval eval`,
`oscar-eval bench` and the lm-eval plugin, below the eval loop so that none of them imports another."""

from __future__ import annotations

import os


def kernel_options(text: str | None = None, backend: str | None = None, environ=None):
    """The run's quant.kernels.KernelOptions: the defaults, then the environment's OSCAR_* overrides (read here,
    once), then `--kernels`; `--backend X` is `--kernels backend=X` (both, disagreeing: ValueError)."""
    from quant.kernels.options import KernelOptions

    if backend:
        asked = KernelOptions.parse(text).backend if text else None
        if asked and asked != backend:
            raise ValueError(f"--backend {backend} and --kernels backend={asked} disagree; give one of them")
        text = ",".join(filter(None, [text, f"backend={backend}"]))
    return KernelOptions.parse(text, KernelOptions.from_env(os.environ if environ is None else environ))
