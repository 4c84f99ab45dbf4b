"""Sends from a proxy to a broker process, over one transport: ``stream`` (concurrent sends
coalesced on an event loop into requests), ``links`` (the connection to the broker's send
listener that carries them), ``frames`` (their framing), ``listener`` (the broker's end),
``requests`` (what a broker checks of a send before storing it) and ``metrics``."""
