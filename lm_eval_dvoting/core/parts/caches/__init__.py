"""The cache policies, one per module, each registering itself (`core/parts/__init__.py`
discovers them): its declaration and its pass (`CachePolicy.run_pass`), which
`decoding/caches.py`'s `ForwardPass` runs for the rows of a step that name it."""
