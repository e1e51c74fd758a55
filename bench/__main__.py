"""`python -m bench SUITE [flags]`: run one benchmark suite (`python -m bench SUITE --help`
gives its flags). Run from the repository root, so that `bench` is importable."""

from __future__ import annotations

import importlib
import sys

# suite name -> (module, what it measures); a module is imported only when its suite runs
SUITES: dict[str, tuple[str, str]] = {
    "throughput": (
        "bench.run",
        "every strategy's speed and decoder overhead, one decoding step, the targets "
        "(BENCHMARKS.md's first part)",
    ),
    "caches": ("bench.caches_bench", "Fast-dLLM's prefix and dual caches (its own section)"),
    "static-steps": (
        "bench.static_steps_bench",
        "cached steps of cache=prefix|dual: dynamic, static buffers, CUDA graphs, compiled",
    ),
    "host-reads": (
        "bench.host_reads_bench",
        "host reads (syncs on a GPU) and commit operators per decoder step, per rule (CPU)",
    ),
    "step-profile": (
        "bench.step_profile",
        "one cached reuse step, kernel by kernel: where its time goes (a GPU's kernels)",
    ),
    "decode-modes": (
        "bench.decode_modes",
        "whole decodes under each cached_steps mode, the threshold rule too (graphs on a GPU)",
    ),
    "refill": (
        "bench.refill_bench",
        "operators (kernel launches on a GPU) and CPU time of one refill of the static buffers",
    ),
    "digests": (
        "bench.digests_bench",
        "digests of many fixture decodes, to compare two commits' tokens (--package)",
    ),
    "experts": (
        "bench.experts_bench",
        "a MoE layer's routed experts: grouped GEMMs against the loop over experts",
    ),
    "fastdllm": (
        "bench.fastdllm_bench",
        "Fast-dLLM's own LLaDA generate against ours: same model, tokens and times (issue #43)",
    ),
    "gpu": ("bench.gpu_bench", "LLaDA-8B's full shape in bfloat16 on a GPU (its own section)"),
    "moe": ("bench.moe_bench", "the LLaDA2.0-mini proxy: MoE layer and block cache"),
    "temporal": ("bench.temporal_bench", "what strategy=temporal costs over single"),
    "batch-invariance": (
        "bench.batch_invariance",
        "accuracy and NFE against --batch_size, per dtype (docs/batch_invariance.md)",
    ),
    "projection": (
        "bench.projection",
        "a PROJECTION of whole-task wall times on one GPU from `gpu`'s step times (CPU, seconds)",
    ),
    "selected-tasks": (
        "bench.selected_tasks",
        "lm-eval's start-up time up to 'Selected Tasks' (takes lm_eval's arguments)",
    ),
}


def usage() -> str:
    width = max(map(len, SUITES))
    rows = [f"  {name:<{width}}  {about}" for name, (_, about) in SUITES.items()]
    return "usage: python -m bench SUITE [flags]\n\nsuites:\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the suite named by the first argument with the rest of the arguments."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in SUITES:
        raise SystemExit(
            f"python -m bench: unknown suite {argv[0]!r}; choose one of "
            f"{', '.join(SUITES)} (python -m bench --help says what each measures)"
        )
    module = importlib.import_module(SUITES[argv[0]][0])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    raise SystemExit(main())
