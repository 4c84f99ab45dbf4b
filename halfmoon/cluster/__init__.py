"""Cluster mode: brokers in their own processes behind stateless proxies.

Coordination through etcd: ``etcd`` (the client), ``keys`` (the key layout),
``membership`` (leases), ``metadata`` and ``placement`` (topics, groups,
settings), ``view`` (the watched cache every process reads).

The internal broker protocol: ``wire`` (the encoding), ``internal_service``
(the broker's side), ``connection``, ``coalescer``, ``events`` and
``remote_broker`` (the ``Broker`` facade spoken over it). ``halfmoon broker``
itself is ``halfmoon.broker_node``: it assembles this package, the broker and
``halfmoon.replication``, so it sits above both. See docs/cluster.md.
"""
