"""Test helpers that build real NAT topologies with Linux network namespaces (see topology.py)."""
