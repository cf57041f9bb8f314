"""The benchmarks' parts: the sweep, the session (arena, ceiling, timers), one forward and one
backward benchmark, the timers."""
