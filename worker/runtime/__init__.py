"""The worker's runtime: RQ slots, the engine loop, publishing events, heartbeats, the reaper,
the watchdog and drain: everything that feeds the engine and reports what it does."""
