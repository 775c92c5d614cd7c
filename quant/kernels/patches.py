"""What the layer kernels change on a model, kept so that it can be taken back exactly.

`Patches` records every instance attribute the patchers set on a model's modules (instance `forward`s and the
attributes they read), every forward hook they register and every callback that undoes something else (RoPE's
dispatcher on a transformers modeling module); `undo()` restores the modules as they were: no instance attribute
left that was not there, classes never touched.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class Patches:
    """The layer kernels put under one model (quant.kernels.patch_model); `counts` says how many of each kind."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self._attrs: list[tuple[torch.nn.Module, str]] = []
        self._undo: list[Callable[[], None]] = []

    def set(self, module: torch.nn.Module, name: str, value: Any) -> None:
        """Set instance attribute `name` of `module` (one it does not have: a patcher skips modules already patched)."""
        if name in module.__dict__:
            raise ValueError(f"{type(module).__name__} already has an instance attribute {name!r}")
        module.__dict__[name] = value  # not a parameter, buffer or submodule: the plain instance dict
        self._attrs.append((module, name))

    def on_undo(self, fn: Callable[[], None]) -> None:
        """Run `fn` at undo (after the attributes are gone; in the reverse order of registration)."""
        self._undo.append(fn)

    def add(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n

    def undo(self) -> None:
        """Take every patch back; a second call does nothing."""
        for module, name in reversed(self._attrs):
            module.__dict__.pop(name, None)
        self._attrs.clear()
        while self._undo:
            self._undo.pop()()
        self.counts = {}
