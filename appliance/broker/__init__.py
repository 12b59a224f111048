"""The MQTT broker core (sans-I/O) and its asyncio adapter."""
