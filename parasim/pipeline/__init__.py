"""Pipeline parallelism: schedules as data (schedules.py), a slot-timing model (timing.py) and an executor
that runs a schedule on real layers over PP ranks (executor.py)."""
