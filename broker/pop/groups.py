"""Consumer-group configs: created with the broker's defaults on first use, kept durable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from popmq.broker.api.errors import BrokerError, Code
from popmq.broker.api.types import ConsumeMode, GroupConfig
from popmq.broker.pop.names import check_group

from popmq.config import PopConfig, parse_duration_ms

if TYPE_CHECKING:
    from popmq.broker.store.message_store import MessageStore

STATE_NAME = "groups"


def _to_json(config: GroupConfig) -> dict[str, Any]:
    return {
        "name": config.name,
        "consume_mode": config.consume_mode.value,
        "max_attempts": config.max_attempts,
        "retry_levels": list(config.retry_levels),
        "fifo": config.fifo,
    }


def _from_json(data: dict[str, Any]) -> GroupConfig:
    return GroupConfig(
        name=str(data["name"]),
        consume_mode=ConsumeMode(data.get("consume_mode", "POP")),
        max_attempts=int(data.get("max_attempts", 16)),
        retry_levels=[str(level) for level in data.get("retry_levels", [])],
        fifo=bool(data.get("fifo", False)),
    )


class GroupRegistry:
    def __init__(self, store: MessageStore, pop: PopConfig) -> None:
        self._store = store
        self._pop = pop
        self._groups: dict[str, GroupConfig] = {}
        self._level_ms: dict[str, list[int]] = {}

    def load(self) -> None:
        saved = self._store.load_state(STATE_NAME) or {}
        self._groups = {name: _from_json(data) for name, data in saved.items()}
        self._level_ms = {}

    def _save(self) -> None:
        self._store.save_state(STATE_NAME, {n: _to_json(c) for n, c in self._groups.items()})

    def get(self, name: str) -> GroupConfig:
        config = self._groups.get(name)
        if config is None:
            check_group(name)
            config = GroupConfig(name=name, max_attempts=self._pop.max_attempts)
            self._groups[name] = config
            self._save()
        return config

    def update(self, config: GroupConfig) -> GroupConfig:
        check_group(config.name)
        if config.max_attempts < 1:
            raise BrokerError(Code.BAD_REQUEST, "max_attempts must be at least 1")
        for level in config.retry_levels:
            try:
                parse_duration_ms(level)
            except ValueError as err:
                raise BrokerError(Code.BAD_REQUEST, f"bad retry level: {err}") from None
        stored = GroupConfig(
            name=config.name,
            consume_mode=config.consume_mode,
            max_attempts=config.max_attempts,
            retry_levels=list(config.retry_levels),
            fifo=config.fifo,
        )
        self._groups[config.name] = stored
        self._level_ms.pop(config.name, None)
        self._save()
        return stored

    def retry_delay_ms(self, config: GroupConfig, reconsume_times: int) -> int:
        """Backoff before the Nth redelivery: the group's levels, else the broker's; scaled."""
        if not config.retry_levels:
            return self._pop.retry_delay_ms(reconsume_times)
        levels = self._level_ms.get(config.name)
        if levels is None:
            levels = [parse_duration_ms(level) for level in config.retry_levels]
            self._level_ms[config.name] = levels
        index = min(max(reconsume_times, 1), len(levels)) - 1
        return int(levels[index] * self._pop.time_scale)
