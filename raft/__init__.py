"""raft: the replicated state machine.

`commands` is the versioned log format, `state_machine.apply` the pure function every node runs on
each committed entry, `node.RaftNode` the thin PySyncObj adapter, and `snapshot` the log-compaction
hooks that ship a compact LMDB copy to lagging or wiped followers.
"""
