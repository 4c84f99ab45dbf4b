"""The proxy: ``cluster_broker`` (the facade over a ``broker_pool`` of remote brokers),
``routing`` and ``send_plan`` (which broker serves a call), the session directory and
command relay between proxy workers, and the process (``cluster_proxy``, ``proxy_process``)."""
