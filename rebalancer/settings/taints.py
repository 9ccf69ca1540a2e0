"""A taint in the settings: one a pool's serving nodes carry, or one its lent nodes get.

Where it sits: a block of ``PoolSettings`` (``serving_taints``, ``lent_taints``); the pools
file (rebalancer/commands/pools.py) reads its taints with ``taint_text`` too, so that both
accept the short form ``key=value:Effect``.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic
from pydantic import Field
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from rebalancer.core import model, nodepools
from rebalancer.settings.values import SettingsBlock


class TaintSettings(SettingsBlock):
    """A taint, as a mapping or as ``key=value:Effect`` (``key:Effect`` without a value)."""

    key: str = Field(min_length=1)
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        return taint_text(data)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: pydantic.GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        effects = "|".join(nodepools.EFFECTS)
        text = {
            "type": "string",
            "pattern": f"^[^=:]+(=[^:]*)?:({effects})$",
            "description": "key=value:Effect or key:Effect",
        }
        return {"anyOf": [text, handler(schema)]}

    def taint(self) -> model.Taint:
        return model.Taint(key=self.key, value=self.value, effect=self.effect)


def taint_text(data: Any) -> Any:
    """A taint written ``key=value:Effect`` (or ``key:Effect``) as the mapping it stands for;
    anything else as it is. For a taint model's ``before`` validator: the settings' and the pools
    file's."""
    if not isinstance(data, str):
        return data
    head, sep, effect = data.rpartition(":")
    if not sep or effect not in nodepools.EFFECTS or not head:
        raise PydanticCustomError(
            "taint",
            "write a taint as key=value:Effect or key:Effect, Effect one of {effects}",
            {"effects": ", ".join(nodepools.EFFECTS)},
        )
    key, eq, value = head.partition("=")
    return {"key": key, "value": value if eq else None, "effect": effect}
