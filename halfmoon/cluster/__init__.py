"""Cluster mode: brokers in their own processes behind stateless proxies.

Three parts, each a package, on layers of their own (``tests/test_layers.py``):

- ``coordination``: what the processes of a cluster share through etcd (the
  client, the key layout, membership leases, topics and groups, the watched
  view, the AMQP topology, users and ACLs);
- ``internal``: the internal broker protocol (the ``wire`` encoding, the
  ``connection``, the broker's ``internal_service``, the ``send`` transport and
  ``remote_broker``, the ``Broker`` facade spoken over it);
- ``proxy``: the proxy (``cluster_broker`` over a pool of remote brokers, the
  routing of each call, the relay of client commands) and its process.

``errors`` is their common vocabulary. ``halfmoon broker`` itself is
``halfmoon.broker_node``: it assembles ``internal``, ``coordination``, the
broker and ``halfmoon.replication``, so it sits above them. See docs/cluster.md.
"""
