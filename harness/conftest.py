"""Activates the normdiff plugin for ``pytest harness``."""
from harness.plugin import *  # noqa: F401,F403  (pytest collects the hooks from this module)
