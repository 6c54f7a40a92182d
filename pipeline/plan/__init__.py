"""Plans: the schema of a plan and its loading (:mod:`.schema`: ``Plan``, ``load_plan``, the
``cache``/``expect`` sections), YAML reading with file:line positions (:mod:`.yamlio`), the
``shapes:`` section (:mod:`.shapes`), the order and role checks (:mod:`.order`), a layer's
``remove:``/``options:`` edits (:mod:`.layers`) and plans as text (:mod:`.text`: resolve, diff).

The names below are read from :mod:`.schema` on first use, so the engine's option declarations
(:mod:`pipeline.options`, which read YAML positions from :mod:`.yamlio`) import this package
without loading the registry."""
from __future__ import annotations

import importlib
from typing import Any

_SCHEMA = ("Plan", "PassSpec", "CacheSettings", "Expectations", "PlanWarning", "load_plan", "role_pipeline",
           "TOP_LEVEL_KEYS", "LAYER_KEYS", "ROLES", "ROLES_KEY")


def __getattr__(name: str) -> Any:
    if name in _SCHEMA:
        return getattr(importlib.import_module("pipeline.plan.schema"), name)
    raise AttributeError(f"module 'pipeline.plan' has no attribute '{name}'")


__all__ = list(_SCHEMA)
