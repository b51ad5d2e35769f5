"""Megatron-LM jobs: a launch script (or a file of flags) read as parasim's model, layout and step, every
flag accounted for (job.py, by the table in flags.py; the script read as bash would, script.py), and a
plan written back as the flags and the torchrun line that run it (args.py)."""
