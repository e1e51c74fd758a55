"""`dvoting compare`: several strategies, one table and one plot."""
from __future__ import annotations

import json

import pytest

from lm_eval_dvoting import compare


def test_compare_writes_table_json_and_plot(tiny_llada_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    code = compare.main([
        "--model_args", f"pretrained={tiny_llada_dir}", "--tasks", "dvoting_arith",
        "--strategies", "single,majority,dvoting", "--limit", "2", "--gen_kwargs", "max_gen_toks=32", "--out", str(out), "--device", "cpu",
    ])
    assert code == 0
    rows = json.loads((out / "compare.json").read_text())
    assert [r["strategy"] for r in rows] == ["single", "majority", "dvoting"]
    by_name = {r["strategy"]: r for r in rows}
    assert by_name["single"]["mean_nfe"] == 32 and by_name["single"]["mean_samples"] == 1
    assert by_name["majority"]["mean_nfe"] == 5 * 16
    # the settings the requests ran with: the task's length, the strategy's steps
    assert [(s["gen_length"], s["steps"]) for s in by_name["majority"]["settings"]] == [(32, 16)]
    assert all(r["questions"] == 2 for r in rows)
    table = (out / "compare.md").read_text()
    assert "| dvoting |" in table and "BPC vs single" in table
    assert (out / "accuracy_vs_nfe.png").stat().st_size > 1000
    assert "| single |" in capsys.readouterr().out


def test_compare_rejects_unknown_strategy(tiny_llada_dir, tmp_path):
    with pytest.raises(SystemExit, match="unknown strategies"):
        compare.main(["--model_args", f"pretrained={tiny_llada_dir}", "--strategies", "single,best",
                      "--out", str(tmp_path)])
