"""hexhelix.runtime — executors of compiled programs (simulator, torch runtime) and the profiler."""
