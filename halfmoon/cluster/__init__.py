"""Cluster mode: brokers in their own processes behind stateless proxies.

Coordination through etcd: ``etcd`` (the client), ``keys`` (the key layout),
``membership`` (leases), ``metadata`` and ``placement`` (topics, groups,
settings), ``view`` (the watched cache every process reads). See
docs/cluster.md.
"""
