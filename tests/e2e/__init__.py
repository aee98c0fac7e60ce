"""Whole programs: `swarm-node` commands as subprocesses, the dashboard in a browser, join/echo/flood runs."""
