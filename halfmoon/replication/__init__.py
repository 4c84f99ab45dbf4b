"""Broker groups: a master and its replicas, the commit log streamed between them.

- :mod:`defaults`: a group's defaults in one place (the lease, its renewal, the
  controller's poll, the lag bounds), and the failover time and stall they give;
- :mod:`keys`: where a group lives in etcd (members, master, epoch, in-sync set);
- :mod:`coordination`: the group's side of etcd (membership lease, the election
  of the master by compare-and-swap, publishing the in-sync set);
- :mod:`epochs`: the epoch → start-offset table kept on disk;
- :mod:`protocol`: the replication protocol's messages and gRPC methods;
- :mod:`leader`: the master's side (shipping, replicas' progress, the in-sync
  set, sync acknowledgements); :mod:`replicated_store` puts sync replication
  under the broker's acknowledgements;
- :mod:`follower`: the replica's side (fetching and appending);
- :mod:`group_broker`: a ``halfmoon broker --group`` process's role.

The model, the keys and what is left are in docs/replication.md.
"""
