"""The command-line tools: the `dvoting` console script (`cli`) and its `compare` and
`report` subcommands. The lowest layer is `core` (and `models`), then `integration`; no
module below imports these."""
