"""Sends from a proxy to a broker process: ``coalescer`` (concurrent sends gathered into
one request), ``stream`` and ``links`` (the ``SendStream`` and listener links that carry
them), ``frames`` (their framing), ``listener`` (the broker's end), ``requests`` (what a
broker checks of a send before storing it) and ``metrics``."""
