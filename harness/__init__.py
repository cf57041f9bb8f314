"""normdiff harness: the case catalogue, the checks, the pytest plugin and the reports."""
