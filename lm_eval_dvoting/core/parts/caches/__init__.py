"""The cache policies' declarations, one per module, each registering itself
(`core/parts/__init__.py` discovers them); what a pass covers is `decoding/caches.py`'s."""
