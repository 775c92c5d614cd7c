"""A model family: everything the harness and quant/ know of one transformers architecture, in its folder
harness/models/<family>/ (an `__init__.py` with `FAMILY`, its adapter, its synthetic sizes).

Adding a family is that folder and one registry line per checkpoint (harness/models/__init__.py).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path

from quant.traits import ModelTraits


@dataclass(frozen=True)
class Family:
    name: str
    # the modalities its adapter reads (the eval loop refuses a task needing another before any weights load)
    reads: tuple[str, ...]
    # the transformers classes quant/ may fold and patch (quant.prepare_model)
    traits: ModelTraits
    # "module:Class" of its adapter (harness/models/base.py says what an adapter gives)
    adapter: str


def _folders() -> dict[str, str]:
    """Every subpackage of harness/models/ is a family folder."""
    here = Path(__file__).parent
    return {m.name: f"harness.models.{m.name}" for m in pkgutil.iter_modules([str(here)]) if m.ispkg}


# Family name -> the module of its folder: each folder under harness/models/, found there; a family kept elsewhere
# (a test's, a plugin's) is added by its module path.
FAMILIES: dict[str, str] = _folders()


def get_family(name: str) -> Family:
    """The Family of family `name`, imported from its folder."""
    if name not in FAMILIES:
        raise KeyError(
            f"unknown model family {name!r}; families: {', '.join(sorted(FAMILIES))} (a family is a folder "
            "with FAMILY in its __init__.py, listed in harness.models.FAMILIES)"
        )
    return importlib.import_module(FAMILIES[name]).FAMILY


def sizes(name: str):
    """Family `name`'s synthetic module (<folder>/synthetic.py): config(values), model_class(config),
    processor(tokens, settings), and for a family with a tiny preset tiny() -> (config, processor)."""
    get_family(name)  # a clear error for an unknown family
    return importlib.import_module(f"{FAMILIES[name]}.synthetic")
