"""halfmoon: a transactional message broker that speaks RocketMQ 5's gRPC protocol and AMQP 0-9-1.

Importing any part of halfmoon turns grpc's fork handlers off unless the
environment already chose (``GRPC_ENABLE_FORK_SUPPORT``). From grpcio 1.80 on,
a process with a live gRPC channel that starts a child through ``fork`` (any
``subprocess.Popen`` with ``preexec_fn``, as PySpark's Java gateway launch is)
restarts grpc's poller in the child; ``close_fds`` then closes the poller's
epoll descriptor and the child can crash before it ``exec``s
(grpc/grpc#43055): "Java gateway process exited before sending its port
number". halfmoon never uses gRPC in a forked child (its proxy workers are
exec'd), so it needs no fork support. The setting is read when grpc is first
imported, so it must be set here, before any module of halfmoon imports grpc.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
