"""The model registry as a task's scorer sees it (tasks.contract.ModelSource): MMAU-Pro's judge may be a registered
model (MMAU_PRO_JUDGE=smollm2-135m), and tasks never import the harness, so the eval loop hands them this."""

from __future__ import annotations

from typing import Any


class RegistrySource:
    """Registered models, loaded as harness.models.load loads them (real weights, offline)."""

    def __contains__(self, name: str) -> bool:
        from harness.models import MODELS

        return name in MODELS

    def check(self, name: str) -> None:
        from harness.models import check_weights

        check_weights(name, None, "real")

    def load(self, name: str, device: str | None = None, dtype: str | None = None) -> tuple[Any, Any]:
        from harness.models import load

        adapter = load(name, device=device, dtype=dtype)
        return adapter.model, adapter.tokenizer
