"""The offline demo: problem generator, tokenizer, shipped checkpoint, training script."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from lm_eval_dvoting.demo import arith, train
from lm_eval_dvoting.demo.tokenizer import BOXED, EOS, MASK, build_tokenizer

PACKAGED = Path(arith.__file__).resolve().parent / "tiny-arith"
TASK_DIR = Path(__file__).resolve().parents[1] / "task_configs"


def _evaluate(expression: str) -> int:
    assert re.fullmatch(r"[0-9+\-*()]+", expression)
    return eval(expression)  # noqa: S307 - digits and operators only, checked above


def test_generator_is_deterministic_and_right():
    first = [arith.make_problem(random.Random(5)) for _ in range(3)]
    assert first == [arith.make_problem(random.Random(5)) for _ in range(3)]
    assert arith.make_problems(1, 50) == arith.make_problems(1, 50)
    assert arith.make_problems(1, 50) != arith.make_problems(2, 50)
    for problem in arith.make_problems(3, 300):
        assert problem.question.endswith("=?")
        assert _evaluate(problem.question[:-2]) == problem.answer
        *steps, boxed = problem.solution.split(" ")
        assert boxed == f"\\boxed{{{problem.answer}}}" and len(steps) == problem.steps
        value = None
        for step in steps:  # "7+2=9." : each step starts from the previous result and is right
            left, result = step.rstrip(".").split("=")
            assert value is None or left.startswith(str(value))
            assert _evaluate(left) == int(result)
            value = int(result)
        assert value == problem.answer


def test_difficulty_knob():
    easy = arith.Difficulty(min_steps=1, max_steps=1, max_operand=3, max_value=5)
    hard = arith.Difficulty(
        min_steps=5, max_steps=6, max_operand=20, max_value=99, operations=("+", "-", "*")
    )
    for problem in [arith.make_problem(random.Random(i), easy) for i in range(200)]:
        assert problem.steps == 1
        first, operand = map(int, re.findall(r"\d+", problem.question))
        assert 1 <= first <= 5 and 1 <= operand <= 3
        assert 0 <= problem.answer <= 5
    hard_problems = arith.make_problems(0, 200, hard)
    assert {p.steps for p in hard_problems} == {5, 6}
    assert any("*" in p.question for p in hard_problems)
    assert all(_evaluate(p.question[:-2]) == p.answer for p in hard_problems)
    with pytest.raises(ValueError):
        arith.Difficulty(min_steps=3, max_steps=2)
    with pytest.raises(ValueError):
        arith.Difficulty(operations=("/",))
    two_digit = arith.Difficulty(max_operand=9, max_value=99, min_start=10)
    assert all(
        int(re.match(r"\d+", p.question).group()) >= 10
        for p in arith.make_problems(0, 100, two_digit)
    )
    with pytest.raises(ValueError):  # only 5 * 3 * 2 distinct one-step questions exist here
        arith.make_problems(0, 200, easy)


def test_prompt_is_the_papers_gsm8k_prompt():
    assert arith.format_prompt("1+2=?") == (
        "Please answer the question step by step and put the answer in \\boxed{}. 1+2=?"
    )
    task_yaml = (TASK_DIR / "dvoting_arith.yaml").read_text()
    assert (
        'doc_to_text: "Please answer the question step by step and put the answer in \\\\boxed{}. '
        '{{question}}"' in task_yaml
    )


def test_shipped_test_set_is_seeded_and_held_out():
    rows = arith.read_test_set()
    assert len(rows) >= 500
    test, valid = arith.held_out_sets()
    assert [json.loads(p.to_json()) for p in test] == rows  # regenerable from TEST_SEED
    forms = {arith.canonical_form(r["question"]) for r in rows}
    assert len(forms) == len(rows)  # no two test problems are reorderings of one another
    assert not forms & {arith.canonical_form(p.question) for p in valid}
    args = train.parse_args(["--out", "unused", "--solution-order", "commuted"])
    held_out, _ = train.held_out_problems(args)
    assert forms <= held_out
    sample = [
        p for step in range(0, 2000, 40) for p in train.training_problems(step, args, held_out)
    ]
    assert len(sample) >= 3000 and not forms & {arith.canonical_form(p.question) for p in sample}
    # the trained texts too: no trained solution is a worked solution of a test problem
    test_solutions = {
        commuted
        for r in rows
        for order in arith.solution_orders(arith.Problem(**r))
        for commuted in _all_commutations(order)
    }
    assert not test_solutions & {p.solution for p in sample}


def _all_commutations(solution: str) -> set[str]:
    """`solution` with every subset of its additions turned round."""
    texts = {solution}
    for match in re.finditer(r"\b(\d+)\+(\d+)=", solution):
        a, b = match.groups()
        texts |= {t[: match.start()] + f"{b}+{a}=" + t[match.end() :] for t in texts}
    return texts


def test_canonical_form_makes_reorderings_one_problem():
    same = ["4+3-2=?", "4-2+3=?", "3+4-2=?", "3-2+4=?"]
    assert {arith.canonical_form(q) for q in same} == {("+3", "+4", "-2")}
    assert arith.canonical_form("4+3-2=?") != arith.canonical_form("4-3+2=?")  # other signs
    assert arith.canonical_form("4+3=?") != arith.canonical_form("4+3+0=?")
    assert arith.canonical_form("(2+1)*3=?") != arith.canonical_form(
        "(1+2)*3=?"
    )  # no reordering with *
    # a test problem's form is never drawn for training, whatever order or steps it comes in
    args = train.parse_args(
        ["--out", "unused", "--solution-order", "commuted", "--batch-size", "256"]
    )
    held_out, _ = train.held_out_problems(args)
    twins = [
        p
        for step in range(40)
        for p in [arith.make_problem(random.Random(step * 7919 + i)) for i in range(200)]
        if arith.canonical_form(p.question) in held_out
    ]
    assert len(twins) > 100  # the generator does produce held-out forms; the filter must drop them
    trained = {
        arith.canonical_form(p.question)
        for step in range(40)
        for p in train.training_problems(step, args, held_out)
    }
    assert not trained & held_out


def test_task_loader_reads_the_shipped_set():
    import importlib.util

    spec = importlib.util.spec_from_file_location("arith_task", TASK_DIR / "arith_task.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    docs = module.load_test(some_model_arg=1)["test"]
    assert len(docs) == len(arith.read_test_set())
    assert docs[0]["target"] == str(arith.read_test_set()[0]["answer"])


def test_validation_task_asks_the_validation_problems_never_the_test_ones():
    """`dvoting_arith_valid` (the set the demo's settings are chosen on) is the validation
    stream of `held_out_sets`, asked like `dvoting_arith`, and shares no problem with it."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False)
    tasks = manager.load(["dvoting_arith", "dvoting_arith_valid"])["tasks"]
    test, valid = (list(tasks[name].eval_docs) for name in ("dvoting_arith", "dvoting_arith_valid"))
    _, expected = arith.held_out_sets()
    assert [d["question"] for d in valid] == [p.question for p in expected] and len(
        valid
    ) == arith.VALID_SIZE
    assert [d["target"] for d in valid] == [str(p.answer) for p in expected]
    assert not {arith.canonical_form(d["question"]) for d in valid} & {
        arith.canonical_form(d["question"]) for d in test
    }
    ask = {name: tasks[name].doc_to_text(valid[0]) for name in tasks}
    assert (
        ask["dvoting_arith"]
        == ask["dvoting_arith_valid"]
        == arith.format_prompt(valid[0]["question"])
    )
    config = tasks["dvoting_arith_valid"].config
    assert config.generation_kwargs == tasks["dvoting_arith"].config.generation_kwargs


def test_tokenizer_round_trips_and_loads(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = build_tokenizer()
    problem = arith.make_problem(random.Random(0))
    text = arith.format_prompt(problem.question) + problem.solution
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text
    assert ids[0] == tokenizer.convert_tokens_to_ids(arith.INSTRUCTION)  # the sentence is one token
    assert tokenizer.convert_tokens_to_ids(BOXED) in ids
    assert len(ids) == 1 + 1 + len(problem.question) + len(problem.solution) - len(BOXED) + 1
    assert tokenizer.decode(tokenizer("x\ny {} ?").input_ids) == "x\ny {} ?"
    tokenizer.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert loaded(text, add_special_tokens=False).input_ids == ids
    assert loaded.eos_token == EOS and loaded.mask_token == MASK and loaded.pad_token == EOS
    rendered = loaded.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == text


@pytest.mark.parametrize("name, family", [("tiny-arith", "llada"), ("tiny-arith-dream", "dream")])
def test_packaged_checkpoint_loads(name, family):
    from lm_eval_dvoting.models.loading import PACKAGED_CHECKPOINTS, load_model, load_tokenizer

    folder = PACKAGED_CHECKPOINTS[name]
    assert (folder / "TRAINING.md").exists()
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size < 20 * 2**20
    model = load_model(name)
    tokenizer = load_tokenizer(name)
    assert model.family == family and model.logits_shift == (family == "dream")
    assert model.mask_token_id == tokenizer.mask_token_id
    assert tokenizer.eos_token_id in model.end_token_ids
    ids = tokenizer(
        arith.format_prompt("1+2=?"), return_tensors="pt", add_special_tokens=False
    ).input_ids
    with torch.no_grad():
        logits = model(ids)
    assert logits.shape[:2] == ids.shape and torch.isfinite(logits).all()


MICRO = [
    "--d-model",
    "16",
    "--n-layers",
    "1",
    "--n-heads",
    "2",
    "--mlp",
    "32",
    "--batch-size",
    "8",
    "--steps",
    "6",
    "--warmup",
    "2",
    "--eval-every",
    "1000",
    "--eval-size",
    "8",
    "--ckpt-every",
    "2",
]


def test_training_resumes_to_the_same_result(tmp_path):
    from lm_eval_dvoting.models.loading import load_model

    straight = train.main(["--out", str(tmp_path / "a"), *MICRO])
    # first sitting stops after one step (0 minutes), the second resumes from last.pt
    train.main(["--out", str(tmp_path / "b"), *MICRO, "--max-minutes", "0"])
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=False)["step"] == 1
    resumed = train.main(["--out", str(tmp_path / "b"), *MICRO])
    assert straight["step"] == resumed["step"] == 6
    for net in ("model", "ema"):
        a, b = straight[net].state_dict(), resumed[net].state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    # the best model is exported as a LLaDA checkpoint folder that load_model reads
    exported = load_model(tmp_path / "a" / "best")
    assert exported.family == "llada"
    log = [json.loads(line) for line in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 6 and "valid_acc_ema" in log[-1]
    # a curriculum stage starts from an earlier stage's exported weights
    stage = train.main(
        [
            "--out",
            str(tmp_path / "c"),
            *MICRO,
            "--steps",
            "1",
            "--eval-every",
            "1",
            "--init-from",
            str(tmp_path / "a" / "best"),
            "--max-value",
            "9",
            "--min-start",
            "1",
        ]
    )
    assert stage["step"] == 1 and (tmp_path / "c" / "best" / "training_state.json").exists()


def test_solution_orders_are_valid_worked_solutions():
    """Every order works the same terms (the first number first), keeps running results
    in range and ends in the right answer; the question's own order comes first."""
    counts = []
    for problem in arith.make_problems(4, 300):
        orders = arith.solution_orders(problem)
        counts.append(len(orders))
        assert orders[0] == problem.solution
        assert len(set(orders)) == len(orders)
        terms = sorted(re.findall(r"[+-]\d+", problem.question))
        for order in orders:
            assert order.endswith(f"\\boxed{{{problem.answer}}}")
            steps = re.findall(r"(\d+)([+-])(\d+)=(\d+)\.", order)
            assert len(steps) == problem.steps
            assert steps[0][0] == re.match(r"\d+", problem.question).group()
            assert sorted(op + b for _, op, b, _ in steps) == terms
            for (a, op, b, result), nxt in zip(steps, steps[1:] + [None]):
                assert _evaluate(f"{a}{op}{b}") == int(result) and 0 <= int(result) <= 9
                if nxt is not None:
                    assert nxt[0] == result  # running results chain
    assert max(counts) > 1 and min(counts) == 1  # some problems have several paths, some one
    # equal terms give one order, and a multiplication keeps its own order
    assert arith.solution_orders(arith.Problem("5+2+2=?", "5+2=7. 7+2=9. \\boxed{9}", 9, 2)) == [
        "5+2=7. 7+2=9. \\boxed{9}"
    ]
    product = arith.Problem("(2+1)*3=?", "2+1=3. 3*3=9. \\boxed{9}", 9, 2)
    assert arith.solution_orders(product) == [product.solution]


def test_training_can_mix_solution_orders():
    args = train.parse_args(["--solution-order", "any", "--batch-size", "64"])
    held_out, _ = train.held_out_problems(args)
    batch = train.training_problems(3, args, held_out)
    assert batch == train.training_problems(3, args, held_out)  # a function of (seed, step)
    assert all(p.solution in arith.solution_orders(p) for p in batch)
    assert any(
        p.solution != arith.solution_orders(p)[0] for p in batch
    )  # not always the question's order
    plain = train.training_problems(3, train.parse_args(["--batch-size", "64"]), held_out)
    assert all(p.solution == arith.solution_orders(p)[0] for p in plain)


def test_commuted_additions_keep_the_layout_and_the_results():
    """Only additions turn round; every step stays true and every running result and
    the answer stay at the same character positions (what dVoting's remasking compares)."""
    rng = random.Random(0)
    flipped = 0
    for problem in arith.make_problems(5, 200):
        for order in arith.solution_orders(problem):
            commuted = arith.commute_additions(order, rng)
            assert len(commuted) == len(order) and commuted.endswith(f"\\boxed{{{problem.answer}}}")
            steps = re.findall(r"(\d)([+-])(\d)=(\d)\.", commuted)
            originals = re.findall(r"(\d)([+-])(\d)=(\d)\.", order)
            for (a, op, b, result), (a0, op0, b0, result0) in zip(steps, originals, strict=True):
                assert op == op0 and result == result0 and _evaluate(f"{a}{op}{b}") == int(result)
                assert (a, b) == (a0, b0) or (op == "+" and (a, b) == (b0, a0))
                flipped += (a, b) != (a0, b0)
            assert [i for i, c in enumerate(commuted) if c in "=."] == [
                i for i, c in enumerate(order) if c in "=."
            ]
    assert flipped > 100
    args = train.parse_args(["--solution-order", "commuted", "--batch-size", "64"])
    held_out, _ = train.held_out_problems(args)
    batch = train.training_problems(3, args, held_out)
    assert batch == train.training_problems(3, args, held_out)
    assert any(
        p.solution not in arith.solution_orders(p) for p in batch
    )  # some addition turned round


def test_aligned_training_keeps_the_questions_order_and_turns_additions_round():
    """`--solution-order aligned`: the question's own order (so every sample of a problem
    has the same layout), each addition written either way round."""
    args = train.parse_args(["--solution-order", "aligned", "--batch-size", "64"])
    held_out, _ = train.held_out_problems(args)
    batch = train.training_problems(3, args, held_out)
    assert batch == train.training_problems(3, args, held_out)
    turned = 0
    for problem in batch:
        own = arith.solution_orders(problem)[0]  # the question's order
        assert problem.solution in _all_commutations(own)
        turned += problem.solution != own
    assert turned > 10


def test_a_larger_validation_set_extends_the_same_stream():
    test, valid = arith.held_out_sets()
    test_big, valid_big = arith.held_out_sets(valid_size=arith.VALID_SIZE + 100)
    assert (
        test_big == test and valid_big[: len(valid)] == valid and len(valid_big) == len(valid) + 100
    )
    valid_forms = {arith.canonical_form(p.question) for p in valid_big}
    assert not valid_forms & {arith.canonical_form(p.question) for p in test}
    args = train.parse_args(["--valid-size", str(arith.VALID_SIZE + 100)])
    held_out, _ = train.held_out_problems(args)
    assert valid_forms <= held_out  # training never sees the extension either


def test_training_logs_voting_strategies_along_the_curve(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    calls = []

    def scorer(net, tokenizer, strategies, problems, **kwargs):
        """The real scorer (sweep.score_strategies), recording what it was asked and gave."""
        scores = score_strategies(net, tokenizer, strategies, problems, **kwargs)
        calls.append((list(strategies), [p.question for p in problems], scores))
        return scores

    from lm_eval_dvoting.demo.sweep import score_strategies

    monkeypatch.setattr(train, "score_strategies", scorer)
    argv = [
        "--out",
        str(tmp_path),
        *MICRO,
        "--steps",
        "1",
        "--eval-every",
        "1",
        "--eval-size",
        "3",
        "--eval-strategies",
        "dvoting",
        "--ema",
        "0",
    ]
    train.main(argv)
    record = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1])
    # one evaluation (step 1, the model's weights), on the run's 3 validation problems, logged
    # as scored
    _, valid = train.held_out_problems(train.parse_args(argv))
    [(strategies, questions, scores)] = calls
    assert (
        strategies == ["dvoting"]
        and questions == [p.question for p in valid]
        and len(questions) == 3
    )
    assert record["valid_strategies_model"] == scores
    dvoting = scores["dvoting"]
    assert dvoting["acc"] in {round(k / 3, 4) for k in range(4)} and 2 <= dvoting["nfe"] <= 5 * 32
    assert "valid_strategies_ema" not in record  # --ema 0: no moving average to score


def test_sweep_scores_checkpoints_on_validation_problems(capsys):
    from lm_eval_dvoting.demo import sweep

    torch.set_num_threads(1)
    sweep.main(["tiny-arith", "--strategies", "single", "dvoting", "--limit", "12"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["problems"] == 12 and line["single"]["nfe"] == 32.0
    assert 0 < line["dvoting"]["nfe"] <= 5 * 32
    # single is greedy: its accuracy is the plain decoder's on the same 12 problems
    from lm_eval_dvoting.core.answers import extract_answer
    from lm_eval_dvoting.core.decoding import generate
    from lm_eval_dvoting.models.loading import load_model, load_tokenizer

    _, problems = arith.held_out_sets(valid_size=12)
    tokenizer = load_tokenizer("tiny-arith")
    enc = tokenizer(
        [arith.format_prompt(p.question) for p in problems],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )
    out = generate(
        load_model("tiny-arith"),
        enc.input_ids,
        enc.attention_mask,
        gen_length=32,
        block_length=2,
        steps=32,
    )
    texts = [
        tokenizer.decode(t.tolist(), skip_special_tokens=False).split(EOS)[0] for t in out.tokens
    ]
    right = [extract_answer(t, "number") == str(p.answer) for t, p in zip(texts, problems)]
    assert 0 < sum(right) < 12  # neither all right nor all wrong: the comparison says something
    assert line["single"]["acc"] == round(sum(right) / 12, 4)
    assert line["points_over_single"]["dvoting"] == round(
        100 * (line["dvoting"]["acc"] - line["single"]["acc"]), 1
    )


def test_sweep_scores_the_ablation_rows(capsys):
    """`single-entropy` is dVoting's decoder on one greedy sample: fewer passes than the
    fixed schedule's 32; `majority-entropy` draws its 5 fresh samples with it."""
    from lm_eval_dvoting.demo import sweep

    torch.set_num_threads(1)
    sweep.main(
        [
            "tiny-arith",
            "--strategies",
            "single",
            "single-entropy",
            "majority-entropy",
            "--limit",
            "6",
        ]
    )
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["single"]["nfe"] == 32.0 and line["single-entropy"]["nfe"] < 32.0
    assert 5 * line["single-entropy"]["nfe"] / 2 < line["majority-entropy"]["nfe"] < 5 * 32


def test_shipped_model_shows_what_the_readme_says(tmp_path):
    """The README's first command, without HEX and majority (the slow rows): the rows it
    prints for single, single-entropy, single-confidence, majority-entropy, dvoting and temporal
    are reproduced exactly (accuracy, spread and NFE), and what the README reads from them holds:
    dVoting's decoder saves passes, dVoting costs at most 0.6x majority-entropy, and no
    sampled row beats one greedy sample on average."""
    from lm_eval_dvoting.commands import compare

    torch.set_num_threads(1)
    out = tmp_path / "cmp"
    rows_run = [
        "single",
        "single-entropy",
        "single-confidence",
        "majority-entropy",
        "dvoting",
        "temporal",
    ]
    assert (
        compare.main(
            [
                "--model_args",
                "pretrained=tiny-arith",
                "--tasks",
                "dvoting_arith",
                "--strategies",
                ",".join(rows_run),
                "--limit",
                "100",
                "--seeds",
                "3",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    printed = (out / "compare.md").read_text()
    demo = (TASK_DIR.parent / "docs" / "DEMO.md").read_text()  # the README's demo, in full
    first_command_output = demo[: demo.index("\n## The model")]
    for name in rows_run:
        ours = re.search(
            rf"^\| {name} \| ([^|]+) \| ([^|]+) \| ([^|]+) \|", printed, re.MULTILINE
        ).groups()
        theirs = re.search(
            rf"^\| {name} \| ([^|]+) \| ([^|]+) \| ([^|]+) \|", first_command_output, re.MULTILINE
        ).groups()
        assert ours == theirs, (name, ours, theirs)  # accuracy (± std), runs, mean NFE
    rows = {r["strategy"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    single = rows["single"]
    assert 30 <= single["accuracy"] <= 85
    assert rows["single-entropy"]["mean_nfe"] < single["mean_nfe"] / 2
    assert rows["dvoting"]["mean_nfe"] <= 0.6 * rows["majority-entropy"]["mean_nfe"]
    assert max(rows[r]["accuracy"] for r in ("majority-entropy", "dvoting")) < single["accuracy"]


def test_readme_confidence_row_on_the_test_set_is_reproduced(tmp_path):
    """The 500-problem table's "one greedy sample, confidence decoder" row, at the block
    length and threshold the validation rule chose (docs/ABLATIONS.md), is what
    `dvoting compare` gives on the test set, to the printed digit."""
    from lm_eval_dvoting.commands import compare

    torch.set_num_threads(1)
    readme = (TASK_DIR.parent / "docs" / "DEMO.md").read_text()  # moved from the README
    row = re.search(
        r"^\| single-confidence \(.*block (\d+), threshold ([\d.]+)\) \| ([\d.]+) \| 1 \(greedy\) "
        r"\| ([\d.]+) \|",
        readme,
        re.MULTILINE,
    )
    block, threshold, accuracy, nfe = row.groups()
    out = tmp_path / "cmp"
    assert (
        compare.main(
            [
                "--model_args",
                f"pretrained=tiny-arith,block_length={block},threshold={threshold}",
                "--tasks",
                "dvoting_arith",
                "--strategies",
                "single-confidence",
                "--batch_size",
                "64",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    [measured] = json.loads((out / "compare.json").read_text())["rows"]
    assert measured["questions"] == 500
    assert (f"{measured['accuracy']:.2f}", f"{measured['mean_nfe']:.1f}") == (accuracy, nfe)


class _Oracle(torch.nn.Module):
    """Logits that put all mass on the right token, `shift` positions to the left of it."""

    def __init__(
        self, ids: torch.Tensor, vocab: int, shift: int, read_with: int | None = None
    ) -> None:
        super().__init__()
        self.ids, self.vocab, self.shift = ids, vocab, shift
        self.logits_shift = shift if read_with is None else read_with  # what the loss reads

    def forward(self, noisy, attention_mask, position_ids):
        logits = torch.zeros(*self.ids.shape, self.vocab)
        targets = torch.roll(self.ids, -self.shift, dims=1)  # position j predicts j + shift
        return logits.scatter(2, targets[..., None], 50.0)


@pytest.mark.parametrize("shift", [0, 1])
def test_the_loss_reads_each_prediction_where_the_family_puts_it(shift):
    """LLaDA predicts position i at i; Dream at i-1. A model that is right under its own
    convention has (almost) no loss; the same logits read the other way are wrong."""
    args = train.parse_args(["--batch-size", "8", "--family", "dream" if shift else "llada"])
    tokenizer = build_tokenizer()
    batch = train.training_batch(0, args, tokenizer, set())
    vocab = len(tokenizer)
    right = train.diffusion_loss(
        _Oracle(batch["input_ids"], vocab, shift), batch, 0, args, 1, "cpu"
    )
    assert right.item() < 1e-6
    wrong = _Oracle(
        batch["input_ids"], vocab, 1 - shift, read_with=shift
    )  # the other family's logits
    assert train.diffusion_loss(wrong, batch, 0, args, 1, "cpu").item() > 1.0


def test_dream_format_training_exports_a_dream_checkpoint(tmp_path):
    from lm_eval_dvoting.models.loading import load_model

    torch.set_num_threads(1)
    train.main(
        ["--out", str(tmp_path), *MICRO, "--family", "dream", "--steps", "2", "--eval-every", "2"]
    )
    config = json.loads((tmp_path / "best" / "config.json").read_text())
    assert config["model_type"] == "Dream" and config["mask_token_id"] == 1
    model = load_model(tmp_path / "best")
    assert model.family == "dream" and model.logits_shift == 1
    assert any(name.endswith("o_proj.weight") for name, _ in model.named_parameters())


def test_packaged_dream_model_answers_through_dvoting_dream(tmp_path):
    """The Dream-format demo answers in the demo's band through `dvoting-dream`."""
    from lm_eval_dvoting.commands import compare

    torch.set_num_threads(1)
    out = tmp_path / "cmp"
    assert (
        compare.main(
            [
                "--model",
                "dvoting-dream",
                "--model_args",
                "pretrained=tiny-arith-dream",
                "--tasks",
                "dvoting_arith",
                "--strategies",
                "single",
                "--limit",
                "50",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    [row] = json.loads((out / "compare.json").read_text())["rows"]
    assert 30 <= row["accuracy"] <= 85 and row["mean_nfe"] == 32


def test_packaged_dream_model_needs_its_logit_shift():
    """Dream's prediction for position i sits at i-1: read unshifted, the same weights
    decode far worse (the shift is applied the way the model was trained)."""
    from lm_eval_dvoting.demo.sweep import score_strategies
    from lm_eval_dvoting.models.loading import load_model, load_tokenizer

    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny-arith-dream"), load_tokenizer("tiny-arith-dream")
    problems = [arith.Problem(**row) for row in arith.read_test_set()[:40]]
    shifted = score_strategies(model, tokenizer, ["single"], problems)["single"]["acc"]
    model.logits_shift = 0
    unshifted = score_strategies(model, tokenizer, ["single"], problems)["single"]["acc"]
    assert shifted >= 0.3 and unshifted <= shifted - 0.2, (shifted, unshifted)


@pytest.mark.slow
def test_readme_rfg_rows_on_the_test_set_are_reproduced(tmp_path):
    """The README's RFG table: the policy (tiny-arith + the shipped adapter) and rfg at the
    default guidance, on the 500 test problems, to the printed digit (about a minute)."""
    from lm_eval_dvoting.commands import compare

    torch.set_num_threads(1)
    readme = (TASK_DIR.parent / "docs" / "DEMO.md").read_text()  # moved from the README
    policy = re.search(
        r"^\| single, `tiny-arith` \+ adapter \(the policy\) \| ([\d.]+) \| ([\d.]+) \|",
        readme,
        re.MULTILINE,
    ).groups()
    rfg = re.search(
        r"^\| rfg, `guidance=1.0` \(the default\) \| ([\d.]+) \| ([\d.]+) \|", readme, re.MULTILINE
    ).groups()
    out = tmp_path / "cmp"
    assert (
        compare.main(
            [
                "--model_args",
                "pretrained=tiny-arith,peft=tiny-arith-lora",
                "--tasks",
                "dvoting_arith",
                "--strategies",
                "single,rfg",
                "--batch_size",
                "64",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    rows = {r["strategy"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    assert all(r["questions"] == 500 for r in rows.values())
    for name, (accuracy, nfe) in (("single", policy), ("rfg", rfg)):
        assert (f"{rows[name]['accuracy']:.2f}", f"{rows[name]['mean_nfe']:.1f}") == (accuracy, nfe)


@pytest.mark.slow
def test_the_shipped_adapter_is_what_its_training_command_writes(tmp_path):
    """`python -m lm_eval_dvoting.demo.train_adapter` (about a minute) writes the shipped
    adapter's weights again, bit for bit, and its validation figures."""
    from safetensors.torch import load_file

    from lm_eval_dvoting.demo import train_adapter

    note = train_adapter.main(
        ["--threads", "2", "--out", str(tmp_path / "lora")]
    )  # as it was trained
    shipped = train_adapter.DEFAULT_OUT
    fresh, packaged = (
        load_file(str(f / "adapter_model.safetensors")) for f in (tmp_path / "lora", shipped)
    )
    assert fresh.keys() == packaged.keys() and all(
        torch.equal(fresh[k], packaged[k]) for k in fresh
    )
    assert (
        f"| tiny-arith + this adapter | {note['validation']['adapter']['acc']:.3f} |"
        in (shipped / "TRAINING.md").read_text()
    )
