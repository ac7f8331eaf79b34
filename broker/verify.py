"""`popmq broker verify`: report damage in a broker's data directory without changing it.

Checks, read-only (files are opened for reading only; no lock, no repair, nothing created):
- the FORMAT marker;
- each metadata file (and its ``.prev`` copy): envelope and checksum (metafile.py);
- the topic and group logs (topics.log, state/groups.log): each frame and record;
- every commitlog segment: each frame's length and CRC, resyncing past damage, and gaps
  between segments;
- every queue index against the commitlog: each entry must point at the record of its own
  (topic, queue, offset) and carry its tag hash (a wrong one hides the message from tag
  filters); holes (records recovery already reported lost) are counted. On a running broker,
  entries written after the commitlog was read are told apart from damage (the log grew);
- the pop journal: frames and records.

Damage that an earlier broker start already quarantined (a record exists under
DATA/quarantine/) is listed as ``quarantined``; anything else wrong is ``damaged``.
The result is nonzero (``Report.damaged``) when damage not yet handled was found.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from popmq.broker.pop.journal import JOURNAL_RESYNC
from popmq.broker.store import data_format, metafile
from popmq.broker.store.codec import decode_header, tag_hash
from popmq.broker.store.damage import Quarantine
from popmq.broker.store.framing import HEADER_SIZE, Resync, walk_frames
from popmq.broker.store.queue_index import ENTRY, ENTRY_SIZE, HOLE_SIZE
from popmq.broker.store.recovery import RECORD_RESYNC
from popmq.broker.store.topics import TOPICS_RESYNC

OK, INFO, QUARANTINED, DAMAGED = "ok", "info", "quarantined", "damaged"
METADATA_FILES = ("checkpoint.json", "consumer_offsets.json")
LEGACY_METADATA = ("topics.json",)  # read (and migrated) only when still there
# Append-only logs of JSON records: (file, what shows it should exist, what a missing one
# means at the next start). The groups log is the broker's (a store alone has none).
RECORD_LOGS = (
    ("topics.log", "commitlog", TOPICS_RESYNC,
     "topics are rebuilt from the commitlog and index dirs"),
    ("state/groups.log", "pop", Resync(b"{"), "group settings fall back to the defaults"),
)  # fmt: skip


@dataclass(slots=True)
class Finding:
    area: str  # format | metadata | commitlog | index | pop-journal
    file: str  # relative to the data directory
    status: str  # ok | info | quarantined | damaged
    detail: str


@dataclass
class Report:
    data_dir: str
    findings: list[Finding] = field(default_factory=list)
    records: int = 0  # valid commitlog records
    holes: int = 0  # index entries of records reported lost earlier

    @property
    def damaged(self) -> bool:
        return any(f.status == DAMAGED for f in self.findings)

    def add(self, area: str, file: str, status: str, detail: str) -> None:
        self.findings.append(Finding(area, file, status, detail))

    def to_json(self) -> dict:
        return {
            "data_dir": self.data_dir,
            "damaged": self.damaged,
            "records": self.records,
            "holes": self.holes,
            "findings": [asdict(f) for f in self.findings],
        }


def _read(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def verify(data_dir: Path) -> Report:
    data_dir = Path(data_dir)
    report = Report(str(data_dir))
    if not data_dir.is_dir():
        raise NotADirectoryError(f"{data_dir} is not a directory")
    quarantine = Quarantine(data_dir)
    _check_format(data_dir, report)
    _check_metadata(data_dir, report)
    for name, evidence, resync, consequence in RECORD_LOGS:
        expected = (data_dir / evidence).exists()
        _check_record_log(data_dir, name, expected, resync, consequence, quarantine, report)
    damage: list[tuple[int, int]] = []
    records, walked_end = _check_commitlog(data_dir, quarantine, report, damage)
    _check_indexes(data_dir, records, damage, report, walked_end)
    _check_journal(data_dir, quarantine, report)
    return report


def _check_format(data_dir: Path, report: Report) -> None:
    try:
        version = data_format.read_version(data_dir)
    except Exception as exc:  # RefusedError: an unreadable marker
        report.add("format", data_format.MARKER, DAMAGED, str(exc))
        return
    if version is None:
        report.add("format", data_format.MARKER, INFO, "missing (added at the next start)")
    elif version > data_format.CURRENT_VERSION:
        report.add(
            "format", data_format.MARKER, DAMAGED, f"format {version} is newer than this popmq"
        )
    else:
        report.add("format", data_format.MARKER, OK, f"format {version}")


def _check_metadata(data_dir: Path, report: Report) -> None:
    has_data = (data_dir / "commitlog").is_dir()
    names = list(METADATA_FILES)
    names += [
        n for n in LEGACY_METADATA
        if (data_dir / n).exists() or metafile.previous_path(data_dir / n).exists()
    ]  # fmt: skip
    state = data_dir / "state"
    if state.is_dir():
        names += sorted(f"state/{p.name}" for p in state.glob("*.json"))
    for name in names:
        current = metafile.inspect(data_dir / name)
        previous = metafile.inspect(metafile.previous_path(data_dir / name))
        if current == "ok" or current.startswith("legacy"):
            report.add("metadata", name, OK, current)
        elif current == "missing" and not has_data:
            report.add("metadata", name, INFO, "missing (new data directory)")
        else:
            fallback = "previous copy intact" if previous == "ok" else "no intact previous copy"
            report.add("metadata", name, DAMAGED, f"{current}; {fallback}")


def _check_record_log(
    data_dir: Path,
    name: str,
    expected: bool,
    resync: Resync,
    consequence: str,
    quarantine: Quarantine,
    report: Report,
) -> None:
    path = data_dir / name
    if not path.exists():
        legacy = path.with_suffix(".json")
        if legacy.exists() or not expected:
            report.add("metadata", name, INFO, "missing (written at the next start)")
        else:
            report.add("metadata", name, DAMAGED, f"missing; at the next start {consequence}")
        return
    data = _read(path)
    bad = records = 0
    for offset, end, payload in walk_frames(data, 0, resync.prefix, resync.accept):
        if payload is None:
            bad += 1
            _damage(report, quarantine, "metadata", name, offset, end)
            continue
        try:
            record = json.loads(bytes(payload))
            str(record["name"])
        except (ValueError, KeyError, TypeError):
            bad += 1
            _damage(report, quarantine, "metadata", name, offset, end, "unreadable record")
            continue
        records += 1
    if not bad:
        report.add("metadata", name, OK, f"{records} records")


def _segments(data_dir: Path) -> list[Path]:
    root = data_dir / "commitlog"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if len(p.name) == 20 and p.name.isdigit())


def _log_end(segments: list[Path]) -> int:
    """Where the commitlog ends now (start of the last segment + its size)."""
    if not segments:
        return 0
    try:
        return int(segments[-1].name) + segments[-1].stat().st_size
    except OSError:
        return 0


def _check_commitlog(
    data_dir: Path, quarantine: Quarantine, report: Report, damage: list[tuple[int, int]]
) -> tuple[dict[tuple[str, int, int], tuple[int, int, int]], int]:
    """Walk every segment; returns (topic, queue, offset) -> (position, frame size, tag hash)
    and the end of the log as walked; adds each damaged range to ``damage``."""
    records: dict[tuple[str, int, int], tuple[int, int, int]] = {}
    walked_end = 0
    segments = _segments(data_dir)
    for number, path in enumerate(segments):
        start = int(path.name)
        name = f"commitlog/{path.name}"
        data = _read(path)
        damaged = 0
        for offset, end, payload in walk_frames(
            data, 0, RECORD_RESYNC.prefix, RECORD_RESYNC.accept
        ):
            if payload is None:
                damaged += 1
                damage.append((start + offset, start + end))
                _damage(report, quarantine, "commitlog", name, start + offset, start + end)
                continue
            try:
                header = decode_header(payload)
            except (ValueError, UnicodeDecodeError):
                _damage(
                    report,
                    quarantine,
                    "commitlog",
                    name,
                    start + offset,
                    start + end,
                    "undecodable record",
                )
                continue
            key = (header.topic, header.queue_id, header.queue_offset)
            records[key] = (start + offset, end - offset, tag_hash(header.tag))
            report.records += 1
        if number + 1 < len(segments):
            following = int(segments[number + 1].name)
            if start + len(data) < following:
                damage.append((start + len(data), following))
                _damage(
                    report,
                    quarantine,
                    "commitlog",
                    name,
                    start + len(data),
                    following,
                    "bytes missing before the next segment",
                )
        if not damaged:
            report.add("commitlog", name, OK, f"{len(data)} bytes")
        walked_end = start + len(data)
    if not segments:
        report.add("commitlog", "commitlog", INFO, "no segments")
    return records, walked_end


def _damage(
    report: Report,
    quarantine: Quarantine,
    area: str,
    name: str,
    start: int,
    end: int,
    what: str = "",
) -> None:
    detail = f"bytes {start}..{end} ({end - start} bytes)" + (f": {what}" if what else "")
    if quarantine.known(name, start, end):
        report.add(area, name, QUARANTINED, detail + "; reported at an earlier start")
    else:
        report.add(area, name, DAMAGED, detail)


def _check_indexes(
    data_dir: Path,
    records: dict[tuple[str, int, int], tuple[int, int, int]],
    damage: list[tuple[int, int]],
    report: Report,
    walked_end: int,
) -> None:
    root = data_dir / "index"
    if not root.is_dir():
        return
    segments = _segments(data_dir)
    min_position = int(segments[0].name) if segments else 0
    newest: dict[tuple[str, int], int] = {}
    for topic, queue_id, offset in records:
        key = (topic, queue_id)
        newest[key] = max(newest.get(key, -1), offset)
    for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir()):
            if not queue_dir.name.isdigit():
                continue
            _check_index(
                topic_dir.name,
                int(queue_dir.name),
                queue_dir,
                records,
                newest,
                min_position,
                damage,
                report,
                walked_end,
            )


def _check_index(
    topic: str,
    queue_id: int,
    directory: Path,
    records: dict[tuple[str, int, int], tuple[int, int, int]],
    newest: dict[tuple[str, int], int],
    min_position: int,
    damage: list[tuple[int, int]],
    report: Report,
    walked_end: int,
) -> None:
    name = f"index/{topic}/{queue_id}"
    in_damage = 0  # entries whose record lies in damaged commitlog bytes
    files = sorted(p for p in directory.iterdir() if len(p.name) == 20 and p.name.isdigit())
    wrong: list[int] = []
    holes = checked = 0
    beyond: list[int] = []  # entries of records past the end of the log as walked
    top = int(files[0].name) if files else 0
    for path in files:
        first = int(path.name)
        if first != top:
            report.add(
                "index",
                name,
                DAMAGED,
                f"file {path.name} does not follow offset {top} (rebuilt at start)",
            )
            return
        data = _read(path)
        whole = len(data) - len(data) % ENTRY_SIZE
        for i, (position, size, code, _) in enumerate(ENTRY.iter_unpack(data[:whole])):
            offset = first + i
            if size == HOLE_SIZE:
                holes += 1
                continue
            if position < min_position:
                continue  # retention deleted its record
            if position >= walked_end and (topic, queue_id, offset) not in records:
                beyond.append(offset)
                continue
            checked += 1
            if records.get((topic, queue_id, offset)) != (position, size, code):
                if any(lo <= position < hi for lo, hi in damage):
                    in_damage += 1
                else:
                    wrong.append(offset)
        top = first + whole // ENTRY_SIZE
    report.holes += holes
    if beyond and _log_end(_segments(directory.parents[2])) > walked_end:
        # The log grew while we read it: a running broker's newest writes, not damage.
        report.add("index", name, INFO, f"{len(beyond)} entries written after the commitlog "
                   "was read (the broker is running)")  # fmt: skip
    else:
        wrong.extend(beyond)
    behind = newest.get((topic, queue_id), -1) + 1 - top
    if in_damage:
        report.add(
            "index",
            name,
            DAMAGED,
            f"{in_damage} records lost in damaged commitlog "
            "bytes (a broker start reports them and keeps their offsets as holes)",
        )
    if wrong:
        shown = ", ".join(map(str, wrong[:5])) + (" ..." if len(wrong) > 5 else "")
        report.add(
            "index",
            name,
            DAMAGED,
            f"{len(wrong)} of {checked + len(beyond)} entries do not match "
            f"their record (offsets {shown}); with the broker stopped, delete the directory "
            "to rebuild it",
        )
    elif in_damage:
        pass
    elif holes:
        report.add(
            "index",
            name,
            QUARANTINED,
            f"{holes} offsets lost to commitlog damage (reported at an earlier start)",
        )
    else:
        extra = f"; {behind} records behind the log (re-added at start)" if behind > 0 else ""
        report.add("index", name, OK, f"{checked} entries checked{extra}")


def _check_journal(data_dir: Path, quarantine: Quarantine, report: Report) -> None:
    path = data_dir / "pop" / "journal.log"
    name = "pop/journal.log"
    if not path.exists():
        return
    data = _read(path)
    bad = 0
    prefix, accept = JOURNAL_RESYNC.prefix, JOURNAL_RESYNC.accept
    for offset, end, payload in walk_frames(data, 0, prefix, accept):
        if payload is None:
            bad += 1
            _damage(report, quarantine, "pop-journal", name, offset, end)
            continue
        try:
            record = json.loads(bytes(payload))
            kind = record["k"]
        except (ValueError, KeyError, TypeError):
            bad += 1
            _damage(
                report,
                quarantine,
                "pop-journal",
                name,
                offset,
                offset + HEADER_SIZE + len(payload),
                "unreadable record",
            )
            continue
        if kind not in ("ck", "st"):
            bad += 1
            report.add("pop-journal", name, DAMAGED, f"record at {offset}: unknown kind")
    if not bad:
        report.add("pop-journal", name, OK, f"{len(data)} bytes")


def format_table(report: Report) -> str:
    rows = [("AREA", "FILE", "STATUS", "DETAIL")]
    rows += [
        (f.area, f.file, f.status.upper() if f.status == DAMAGED else f.status, f.detail)
        for f in report.findings
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3]
        for row in rows
    ]
    verdict = "DAMAGE FOUND" if report.damaged else "no unhandled damage"
    lines.append(
        f"{report.data_dir}: {report.records} records, {report.holes} lost offsets "
        f"(holes); {verdict}"
    )
    return "\n".join(lines)
