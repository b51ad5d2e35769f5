"""Pipeline parallelism: the action kinds as a table (action.py), schedules as data with their registry
(schedules.py, vshape.py), a slot-timing model (timing.py) and an executor that runs a schedule on real
layers over PP ranks (executor.py)."""
