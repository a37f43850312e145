"""The fleet for asyncio programs: `AsyncFleet`, the `Fleet` client's coroutines (client.py).

Above the public face's `client` (it wraps a `fleet.client.Fleet`); nothing in fleet imports it.
"""
