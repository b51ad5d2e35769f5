"""The one training step every example and the estimator's check run (step.py), what a GPU keeps in it
(keeps.py), the models whole on one rank that every split run is held to (whole.py), and the estimator's plan
held against that step run on symbolic ranks, item by item (against.py, differences.py)."""
