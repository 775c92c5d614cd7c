"""What the process hosting these hooks hands them: lmms-eval runs the hooks of tasks/lmms/ in its own process, and
the oscar-eval model plugin (harness.lmms) hands over the harness's model registry when lmms-eval loads it, so that a
hook may name a registered model (MMAU-Pro's judge: smollm2-135m). Tasks never import the harness."""

from __future__ import annotations

from tasks.contract import ModelSource

_MODELS: list[ModelSource] = []


def set_models(source: ModelSource) -> None:
    """The harness's registry, for the hooks of this process."""
    _MODELS[:] = [source]


def models() -> ModelSource | None:
    """What `set_models` set; None with another model plugin (judges are then named by folder or hub id)."""
    return _MODELS[0] if _MODELS else None
