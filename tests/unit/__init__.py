"""Fast tests: pure logic and in-process components (`python -m pytest tests/unit`)."""
