"""The benchmarks of lm-eval-dvoting, one tool: `python -m bench SUITE [flags]` from the
repository root (`python -m bench --help` lists the suites). `bench/common.py` holds what the
suites share; their raw numbers go to bench/results/, their tables to BENCHMARKS.md."""
