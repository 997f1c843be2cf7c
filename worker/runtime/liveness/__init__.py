"""A worker alive, dead or wedged, as the fleet sees it: its heartbeat (`heartbeat`), live workers
taking over dead ones' jobs (`reaper`, over the jobs read back from RQ: `job_records`), the
watchdog of a wedged loop (`watchdog`), the fence that keeps a worker declared dead from
publishing (`fence`), and a graceful leave (`drain`)."""
