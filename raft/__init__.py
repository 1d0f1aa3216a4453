"""raft: the replicated state machine.

`commands` is the versioned log format, `state_machine.apply` the pure function every node runs on
each committed entry, `node.RaftNode` the Raft node (PySyncObj configured and ticked by kq),
`pysyncobj_adapter` the one module that reaches inside PySyncObj, `snapshot` the log-compaction
hooks that ship a compact LMDB copy to lagging or wiped followers, and `transport` with `wire` the
peer transport PySyncObj runs on (protobuf frames, mutual TLS or an HMAC handshake, no pickle from
the network; `local_pickle` reads back the few pickles the node wrote itself).
"""
