"""Cluster coordination through etcd: ``etcd`` (the client), ``keys`` (the key layout),
``membership`` (leases), ``metadata`` and ``placement`` (topics, groups, settings), ``view``
(the watched cache every process reads), and the stores kept there (``amqp_topology``,
``auth_store``, ``cluster_config``, ``switchover``)."""
