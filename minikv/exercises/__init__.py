"""Exercise checkers, one module per notebook (`nb01_kv_caching.py` serves notebook 01, ...).

A checker tries a learner's function on hidden, generated cases; it prints one line when
everything passes and raises AssertionError saying what was expected and what came back.
"""
