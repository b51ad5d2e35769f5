"""The step-through TUI: a plain-Python view model (view.py) and thin Textual widgets over it (app.py)."""
