"""bench/moe_bench.py: the LLaDA2.0-mini proxy's shape, and a smoke run that writes its own
section of BENCHMARKS.md in place."""

from __future__ import annotations

from bench import moe_bench


def test_the_proxy_has_llada2_mini_shape_and_a_dense_layer_of_its_active_width():
    cfg = moe_bench.proxy_config()
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.kv_heads, cfg.dim_per_head) == (
        2048,
        16,
        4,
        128,
    )
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
    assert text.startswith(f"# Benchmarks\nabove\n{moe_bench.START}") and text.endswith(
        f"{moe_bench.END}\nbelow\n"
    )
    assert "\nold\n" not in text and "| mlp 2x4 | 8 |" in text and "| layer 2x16 | 32 |" in text
    assert "- **Goal** (issue): the MoE MLP within 1.5x" in text and "--quick: a tiny model" in text
    out.write_text("# Benchmarks\n")
    assert moe_bench.main(["--report-only", "--out", str(out), "--json", str(data)]) == 0
    assert (
        out.read_text().startswith(f"# Benchmarks\n\n{moe_bench.START}")
        and "| mlp 1x4 |" in out.read_text()
    )


def test_a_quick_cache_part_times_the_passes_the_block_cache_runs_and_keeps_the_moe_part(tmp_path):
    import json

    out, data = tmp_path / "BENCHMARKS.md", tmp_path / "moe.json"
    assert (
        moe_bench.main(["--quick", "--parts", "moe", "--out", str(out), "--json", str(data)]) == 0
    )
    assert (
        moe_bench.main(
            ["--quick", "--parts", "cache", "--keep", "--out", str(out), "--json", str(data)]
        )
        == 0
    )
    text = out.read_text()
    assert (
        "### The MoE layer against its dense-active equivalent" in text
    )  # kept from the first run
    assert "### The block cache against no cache (**--quick" in text
    assert "| 2 | mid-block | 2 x 16 / 2 x 4 + 12 cached |" in text
    assert "| 2 | first of a block | 2 x 16 / 2 x 8 + 8 cached |" in text
    assert "- **Goal** (issue): the block cache at least 5x faster per step than no cache" in text
    cell = json.loads(data.read_text())["parts"]["cache"]["cells"]["1"]
    assert len(cell["none"]) == len(cell["block"]) == 2  # paired repeats
    assert (
        len(cell["spread"]["none"]) == len(cell["spread"]["block"]) == 2
    )  # the MoE layer on spread inputs
    assert "layer 1 alone on standard-normal" in text
    # prompt 8 + generation 8, block 4, 2 steps a block: no cache decodes block 1 over the whole
    # sequence; the
    # block cache decodes block 0 (its first pass over prompt + block 0, nothing kept yet), then
    # block 1: first
    # over block 0 + block 1 (8 cached keys), then over block 1 alone (12 cached keys)
    assert [(s["block"], s["step"], s["shape"], s["kept"]) for s in cell["none"][0]] == [
        (1, 0, [1, 16], 0),
        (1, 1, [1, 16], 0),
    ]
    assert [(s["block"], s["step"], s["shape"], s["kept"]) for s in cell["block"][0]] == [
        (0, 0, [1, 12], 0),
        (0, 1, [1, 4], 8),
        (1, 0, [1, 8], 8),
        (1, 1, [1, 4], 12),
    ]
    assert all(
        len(s["layers"]) == 2 and 0 < sum(s["layers"]) <= s["forward"] <= s["seconds"]
        for s in cell["block"][0]
    )
