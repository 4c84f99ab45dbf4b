"""The internal broker protocol between proxies and broker processes: ``wire`` (the
encoding), ``connection`` and ``events`` (a peer's channel and its event stream),
``internal_service`` (the broker's side), ``send`` (how sends travel), ``remote_broker``
(the ``Broker`` facade spoken over it), epoch ``fencing``, replica reads, and the
transaction groups that brokers decide together."""
