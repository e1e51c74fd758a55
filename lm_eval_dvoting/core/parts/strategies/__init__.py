"""The strategies, one per module, each registering itself (`core/parts/__init__.py`
discovers them): a new strategy is one new file here."""
