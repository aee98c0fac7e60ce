"""Helper programs for the multi-process libp2p tests (a node, an attacker) and their asyncio controller."""
