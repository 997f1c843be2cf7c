"""The model pool of one machine: its catalog and what each model costs before it loads
(`catalog.py`), its memory budget and which idle models make room (`budget.py`), and the pool
agent that starts one worker process per loaded model and stops it when the model is unloaded
(`agent.py`, `held.py`).
"""
