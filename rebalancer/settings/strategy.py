"""Which strategy a pool runs, and its parameters: ``strategy: forecast`` or a mapping.

Where it sits: ``PoolSettings.strategy``. The strategy is built once as the settings are read
(through the registry, rebalancer/adapters/registry.py) so that its parameters are validated
before anything runs; a bad parameter is a line of its own under ``.params``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pydantic
from pydantic import Field
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from rebalancer.adapters import registry
from rebalancer.settings.values import SettingsBlock

if TYPE_CHECKING:
    from rebalancer.core.strategy import Strategy


class StrategySettings(SettingsBlock):
    name: str = registry.DEFAULT
    params: dict[str, Any] = Field(default_factory=dict)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data  # ``strategy: forecast``

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: pydantic.GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # Each built-in strategy's parameters, checked when the name is that strategy's; a name
        # of a strategy registered elsewhere is left to the loader.
        mapping = handler.resolve_ref_schema(handler(schema))
        mapping["allOf"] = [
            {
                "if": {"properties": {"name": {"const": name}}},
                "then": {"properties": {"params": registry.params_type(name).model_json_schema()}},
            }
            for name in registry.built_in()
        ]
        return {"anyOf": [{"type": "string", "minLength": 1}, mapping]}

    @pydantic.field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in registry.names():
            raise PydanticCustomError(
                "strategy",
                "unknown strategy; choose one of {names}",
                {"names": ", ".join(registry.names())},
            )
        try:
            registry.params_type(value)  # a plugin that does not load is said here, by name
        except registry.ParameterError as exc:
            why = "; ".join(exc.problems)
            raise PydanticCustomError("strategy", "{why}", {"why": why}) from None
        return value

    @pydantic.model_validator(mode="after")
    def _params_validate(self) -> StrategySettings:
        try:
            registry.build(self.name, self.params)
        except registry.ParameterError as exc:
            # One line per bad parameter; ``problem_lines`` expands them under ``.params``.
            raise PydanticCustomError(
                "strategy_params",
                "{problems}",
                {"problems": "; ".join(exc.problems), "lines": tuple(exc.problems)},
            ) from None
        return self

    def build(self) -> Strategy:
        return registry.build(self.name, self.params)
