"""halfmoon's Python client: asyncio-native, over RocketMQ 5's gRPC protocol."""
