"""The checks' judging: the case catalogue and its shapes, drawing inputs, the oracle's comparison and
tolerances, the guards, running one check of a kernel and judging it, the property checks."""
