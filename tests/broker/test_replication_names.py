"""File names a leader sends a follower (replica.check_path): only the replicated files, in
their one spelling. A name the follower cannot even open (a NUL byte) is refused like any
other bad name (ReplicationError: the stream ends and is retried), not a ValueError that ends
the follower's role until the next election. The follower caches the names it checked: a
refused name is refused every time it comes."""

from __future__ import annotations

from pathlib import Path

import pytest
from popmq.broker.replication.replica import ReplicationError, ReplicaWriter, check_path

from popmq.pb.replication.v1 import replication_pb2 as pb

BAD = [
    "state/a\x00.json",  # os.open raised ValueError: the follower stopped until a role change
    "FORMAT\x00",
    "state//a.json",  # other spellings of a replicated name
    "state/./a.json",
    "state/a.json/",
    "./FORMAT",
    "state/../a.json",
    "../state/a.json",
    "/state/a.json",
    "state/.a.json",
    "state/sub/a.json",
    "commitlog/00000000000000000000",
    "checkpoint.json",
    "",
]


@pytest.mark.parametrize("name", BAD)
def test_a_name_outside_the_replicated_set_is_refused(name: str) -> None:
    with pytest.raises(ReplicationError):
        check_path(name)


@pytest.mark.parametrize("name", ["FORMAT", "topics.log", "pop/journal.log", "state/g.json"])
def test_the_replicated_names_are_accepted(name: str) -> None:
    assert check_path(name) == name


def test_a_follower_refuses_a_bad_name_every_time_it_comes(tmp_path: Path) -> None:
    writer = ReplicaWriter(tmp_path / "follower")
    writer.open()
    try:
        good = pb.FileChange(path="state/g.json", kind=pb.FileChange.REPLACE, data=b"{}")
        writer.apply(pb.ReplicaBatch(sequence=1, epoch=1, truncate_to=-1, files=[good]), 0)
        assert (tmp_path / "follower" / "state" / "g.json").read_bytes() == b"{}"
        for sequence in (2, 3):
            bad = pb.FileChange(path="state/g\x00.json", kind=pb.FileChange.REPLACE, data=b"x")
            batch = pb.ReplicaBatch(sequence=sequence, epoch=1, truncate_to=-1, files=[good, bad])
            with pytest.raises(ReplicationError):
                writer.apply(batch, 0)
        assert sorted(p.name for p in (tmp_path / "follower" / "state").iterdir()) == ["g.json"]
    finally:
        writer.close()
