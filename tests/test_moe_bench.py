"""bench/moe_bench.py: the LLaDA2.0-mini proxy's shape, and a smoke run that writes its own
section of BENCHMARKS.md in place."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import moe_bench  # noqa: E402


def test_the_proxy_has_llada2_mini_shape_and_a_dense_layer_of_its_active_width():
    cfg = moe_bench.proxy_config()
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.kv_heads, cfg.dim_per_head) == (2048, 16, 4, 128)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (256, 8, 512)
    assert (cfg.num_shared_experts, cfg.n_group, cfg.topk_group) == (1, 8, 4)
    assert moe_bench.dense_active_width(cfg) == 4608  # (8 routed + 1 shared) x 512
    total, active = moe_bench.parameter_counts(cfg)
    assert 15.5e9 < total < 16.5e9 and 1.35e9 < active < 1.5e9  # the published 16B / 1.4B


def test_a_quick_run_writes_its_section_in_place_and_rewrites_it_from_its_json(tmp_path):
    out, data = tmp_path / "BENCHMARKS.md", tmp_path / "moe.json"
    out.write_text(f"# Benchmarks\nabove\n{moe_bench.START}\nold\n{moe_bench.END}\nbelow\n")
    assert moe_bench.main(["--quick", "--out", str(out), "--json", str(data)]) == 0
    text = out.read_text()
    assert text.startswith(f"# Benchmarks\nabove\n{moe_bench.START}") and text.endswith(f"{moe_bench.END}\nbelow\n")
    assert "old" not in text and "| mlp 2x4 | 8 |" in text and "| layer 2x16 | 32 |" in text
    assert "- **Goal** (issue): the MoE MLP within 1.5x" in text and "--quick: a tiny model" in text
    out.write_text("# Benchmarks\n")
    assert moe_bench.main(["--report-only", "--out", str(out), "--json", str(data)]) == 0
    assert out.read_text().startswith(f"# Benchmarks\n\n{moe_bench.START}") and "| mlp 1x4 |" in out.read_text()
