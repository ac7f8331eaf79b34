"""Replication of a broker group: the leader copies its data directory to followers.

role.py       the injected role (who leads, which epoch) and the in-sync report
epochs.py     the epoch -> first commitlog position history (epochs.json)
files.py      what of the data directory travels, read on the leader (DataSnapshotter)
replica.py    applying batches on a follower (ReplicaWriter)
in_sync.py    the leader's in-sync bookkeeping (pure logic, injected clock)
leader.py     the leader's replication service: one sender per follower, the sync barrier
follower.py   the follower's client: dial the leader, apply, acknowledge
port.py       the BrokerPort a node serves: replicated writes on a leader, refusals on a follower
node.py       one node of a group: switches between leader and follower as its role changes
"""
