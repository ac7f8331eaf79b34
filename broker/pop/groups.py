"""Consumer-group configs: created with the broker's defaults on first use, kept durable.

Registration is O(1): each new or changed group appends one checksummed frame (a JSON record)
to ``state/groups.log`` instead of rewriting a document of every group. A group created with
the defaults is appended without an fsync (a machine crash that loses it only means it is
created again, identically, on its next use); an explicit update is fsynced before it is
acknowledged. The log is compacted at start when it holds many superseded records.

Upgrade: an old ``state/groups.json`` is migrated into the log once and renamed
``groups.json.migrated``. Damage never stops the broker and never passes silently: a torn or
corrupt tail of the log, or an unreadable groups.json (moved aside to ``.corrupt``), is logged
as an ERROR and counted (``damaged_records``); the groups it held fall back to the defaults.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from popmq.broker.api.errors import BrokerError, Code
from popmq.broker.api.types import ConsumeMode, GroupConfig
from popmq.broker.auto_create import AutoCreateGate
from popmq.broker.pop.names import check_group
from popmq.broker.store.damage import MetadataFallback
from popmq.broker.store.framing import FramedLog, fsync_dir

from popmq.config import GroupDefaults, PopConfig, parse_duration_ms

if TYPE_CHECKING:
    from popmq.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)

LOG_NAME = "groups.log"
LEGACY_NAME = "groups.json"
# Compact at start when the log holds this many more records than there are groups.
_COMPACT_SLACK = 1_000


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


def _record(config: GroupConfig) -> bytes:
    return json.dumps(_to_json(config), separators=(",", ":")).encode()


class GroupRegistry:
    def __init__(
        self,
        store: MessageStore,
        pop: PopConfig,
        defaults: GroupDefaults | None = None,
        on_refused: Callable[[str, str], None] | None = None,
    ) -> None:
        self._store = store
        self._pop = pop
        defaults = defaults or GroupDefaults()
        self._gate = AutoCreateGate(
            "group", defaults.auto_create, defaults.max_auto_created,
            defaults.auto_create_per_second, on_refused,
        )  # fmt: skip
        self._groups: dict[str, GroupConfig] = {}
        self._level_ms: dict[str, list[int]] = {}
        self._log: FramedLog | None = None
        self.damaged_records = 0  # records lost to damage at load (logged as errors)

    @property
    def _dir(self) -> Path:
        return self._store.data_dir / "state"

    # -- loading -----------------------------------------------------------------------------
    def load(self) -> None:
        self.close()
        self._groups, self._level_ms = {}, {}
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / LOG_NAME
        legacy = self._dir / LEGACY_NAME
        if not path.exists() and legacy.exists():
            self._migrate(legacy)
            return
        if not path.exists() and not self._store.was_new:
            # A data directory in use always has the log (created at the first start): it was
            # deleted. Group settings fall back to the defaults, loudly.
            self._report("missing")
            log.error("groups: %s is missing from a data directory in use; every group falls "
                      "back to the default settings until set again", path)  # fmt: skip
        self._log = FramedLog(path)
        if self._log.truncated_bytes:
            self._report(f"{self._log.truncated_bytes} damaged bytes cut")
            log.error("groups: %s had %d damaged bytes at its end (cut); groups recorded there "
                      "fall back to the defaults", path, self._log.truncated_bytes)  # fmt: skip
        records = 0
        for _, payload in self._log.iter_from(0):
            records += 1
            try:
                config = _from_json(json.loads(payload))
            except (ValueError, KeyError, TypeError) as exc:
                self._report("unreadable record")
                log.error("groups: unreadable record in %s skipped: %s", path, exc)
                continue
            self._groups[config.name] = config
        if records > len(self._groups) + _COMPACT_SLACK:
            self._rewrite()

    def _report(self, problem: str) -> None:
        """Count damage to the groups' records: popmq_broker_store_metadata_fallbacks_total."""
        self.damaged_records += 1
        self._store.faults.metadata.append(MetadataFallback(f"state/{LOG_NAME}", "reset", problem))

    def _migrate(self, legacy: Path) -> None:
        """Read an old groups.json once, write it as the log, keep the old file renamed."""
        try:
            saved = json.loads(legacy.read_bytes())
            groups = {str(name): _from_json(data) for name, data in dict(saved).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._report("unreadable groups.json")
            aside = legacy.with_name(LEGACY_NAME + ".corrupt")
            os.replace(legacy, aside)
            log.error("groups: %s is unreadable (%s); moved to %s, groups start from the "
                      "defaults", legacy, exc, aside.name)  # fmt: skip
            self._log = FramedLog(self._dir / LOG_NAME)
            return
        self._groups = groups
        self._rewrite()
        os.replace(legacy, legacy.with_name(LEGACY_NAME + ".migrated"))
        fsync_dir(self._dir)
        log.info("groups: migrated %d groups from %s to %s", len(groups), legacy.name, LOG_NAME)

    def _rewrite(self) -> None:
        """Write every group to a fresh log (temp file, fsync, rename over)."""
        self.close()
        tmp = self._dir / (LOG_NAME + ".tmp")
        tmp.unlink(missing_ok=True)
        fresh = FramedLog(tmp)
        for config in self._groups.values():
            fresh.append(_record(config))
        fresh.close()  # flushes and fsyncs
        os.replace(tmp, self._dir / LOG_NAME)
        fsync_dir(self._dir)
        self._log = FramedLog(self._dir / LOG_NAME)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _append(self, config: GroupConfig, fsync: bool) -> None:
        if self._log is None:
            raise BrokerError(Code.INTERNAL_ERROR, "the group registry is not loaded")
        self._log.append(_record(config))
        self._log.flush(fsync=fsync)

    # -- lookups -----------------------------------------------------------------------------
    def get(self, name: str) -> GroupConfig:
        """The group's config; a client's first use creates it (bounded by the gate)."""
        config = self._groups.get(name)
        if config is None:
            check_group(name)
            self._gate.admit(name, len(self._groups))
            config = GroupConfig(name=name, max_attempts=self._pop.max_attempts)
            self._append(config, fsync=False)
            self._groups[name] = config
        return config

    def settings(self, name: str) -> GroupConfig:
        """The group's config, or the defaults without registering it (revive of a group whose
        record was lost must go on, whatever the auto-creation limits say)."""
        config = self._groups.get(name)
        if config is None:
            return GroupConfig(name=name, max_attempts=self._pop.max_attempts)
        return config

    def __len__(self) -> int:
        return len(self._groups)

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
        self._append(stored, fsync=True)
        self._groups[config.name] = stored
        self._level_ms.pop(config.name, None)
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
