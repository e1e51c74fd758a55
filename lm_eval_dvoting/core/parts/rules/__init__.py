"""The commit rules, one per module, each registering itself (`core/parts/__init__.py`
discovers them): a new commit rule is one new file here."""
