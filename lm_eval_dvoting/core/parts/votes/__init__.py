"""The votes, one per module, each registering itself (`core/parts/__init__.py` discovers
them); the temporal vote's arithmetic is `core/temporal.py`'s."""
