"""Consumer-group configs: created with the broker's defaults on first use, kept durable.

Registration is O(1): each new or changed group appends one checksummed frame (a JSON record)
to ``state/groups.log`` instead of rewriting a document of every group. A group created with
the defaults is appended without an fsync (a machine crash that loses it only means it is
created again, identically, on its next use); an explicit update is fsynced before it is
acknowledged. The log is compacted at start when it holds many superseded records.

A deleted group is a tombstone record (``{"name": ..., "deleted": true}``); compaction drops
it with the records it supersedes.

Upgrade: an old ``state/groups.json`` is migrated into the log once and renamed
``groups.json.migrated``. Damage never stops the broker and never passes silently: damaged
frames of the log (a torn tail, or bytes inside it), an unreadable record, an unreadable
groups.json (moved aside to ``.corrupt``), or a log missing from a data directory that is not
new, are logged as an ERROR, counted (``damaged_records``) and recorded in the store's faults
(metric ``popmq_broker_store_metadata_fallbacks_total{file="state/groups.log"}``); the groups
they held fall back to the defaults.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from popmq.broker.auto_create import AutoCreateGate
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import ConsumeMode, GroupConfig
from popmq.broker.pop.names import check_group
from popmq.broker.store.damage import DAMAGED, TORN_TAIL, DamageEvent, MetadataFallback, Quarantine
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


def _tombstone(name: str) -> bytes:
    return json.dumps({"name": name, "deleted": True}, separators=(",", ":")).encode()


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
            self._fault("missing", "reset")
            log.error("groups: %s is missing from a data directory that is not new; every "
                      "group's settings fall back to the defaults (set them again with "
                      "`popmq admin groups set`)", path)  # fmt: skip
        self._log = FramedLog(path)
        damaged_bytes = sum(run.end - run.start for run in self._log.damage)
        quarantine = Quarantine(self._store.data_dir)
        for run in self._log.damage:  # copied aside before anything is cut or skipped
            event = DamageEvent(f"state/{LOG_NAME}", run.start, run.end,
                                TORN_TAIL if run.tail else DAMAGED)  # fmt: skip
            quarantine.keep(event, run.data)
        if damaged_bytes:
            self.damaged_records += len(self._log.damage)
            self._fault(f"{damaged_bytes} damaged bytes", "reset")
            log.error("groups: %s had %d damaged bytes (%d runs, copied to quarantine/; a "
                      "damaged end is cut); groups recorded there fall back to the defaults",
                      path, damaged_bytes, len(self._log.damage))  # fmt: skip
        records = 0
        for _, payload in self._log.iter_from(0):
            records += 1
            try:
                data = json.loads(payload)
                if data.get("deleted") is True:
                    self._groups.pop(str(data["name"]), None)
                    continue
                config = _from_json(data)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self.damaged_records += 1
                self._fault("unreadable record", "reset")
                log.error("groups: unreadable record in %s skipped: %s", path, exc)
                continue
            self._groups[config.name] = config
        # Damage was copied aside and reported: write a clean log so it is reported once.
        if damaged_bytes or records > len(self._groups) + _COMPACT_SLACK:
            self._rewrite()

    def _fault(self, problem: str, action: str) -> None:
        """Record damage where the store's fault metrics see it."""
        self._store.faults.metadata.append(MetadataFallback(f"state/{LOG_NAME}", action, problem))

    def _migrate(self, legacy: Path) -> None:
        """Read an old groups.json once, write it as the log, keep the old file renamed."""
        try:
            saved = json.loads(legacy.read_bytes())
            groups = {str(name): _from_json(data) for name, data in dict(saved).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.damaged_records += 1
            self._fault("unreadable groups.json", "reset")
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
            raise RefusedError(Code.INTERNAL_ERROR, "the group registry is not loaded")
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

    def configs(self) -> list[GroupConfig]:
        """Every registered group, by name."""
        return [self._groups[name] for name in sorted(self._groups)]

    def delete(self, name: str) -> None:
        """Forget a group's settings: a tombstone record, fsynced before it is acknowledged.
        A later use by a client registers it again with the defaults (if auto-creation
        allows); CONSUMER_GROUP_NOT_FOUND when it is not registered."""
        check_group(name)
        if name not in self._groups:
            raise RefusedError(Code.CONSUMER_GROUP_NOT_FOUND, f"group {name!r} does not exist")
        if self._log is None:
            raise RefusedError(Code.INTERNAL_ERROR, "the group registry is not loaded")
        self._log.append(_tombstone(name))
        self._log.flush(fsync=True)
        del self._groups[name]
        self._level_ms.pop(name, None)

    def update(self, config: GroupConfig) -> GroupConfig:
        check_group(config.name)
        if config.max_attempts < 1:
            raise RefusedError(Code.BAD_REQUEST, "max_attempts must be at least 1")
        for level in config.retry_levels:
            try:
                parse_duration_ms(level)
            except ValueError as err:
                raise RefusedError(Code.BAD_REQUEST, f"bad retry level: {err}") from None
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
