"""Cluster mode: brokers in their own processes behind stateless proxies.

The internal broker protocol (``wire``, ``internal_service``) and the
``Broker`` facade spoken over it (``remote_broker``); ``broker_process`` is
``halfmoon broker``. See docs/cluster.md.
"""
