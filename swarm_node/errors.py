"""Error types the CLI turns into one clear line and exit code 2.

`UserError` is for problems the user can fix (bad config, missing model path, unknown task); anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line."""


class ConfigError(UserError):
    """An unknown key, a bad value or an impossible combination in a config."""
