"""The offline demo: synthetic arithmetic problems, a character tokenizer, and the
training script of the tiny masked-diffusion model shipped as ``pretrained=tiny-arith``.

- `arith`: the seeded problem generator and the paper's GSM8K-style prompt;
- `tokenizer`: the character-level tokenizer in transformers' format;
- `train`: ``python -m lm_eval_dvoting.demo.train --help``.

The shipped checkpoints live in ``demo/tiny-arith/`` (LLaDA format) and
``demo/tiny-arith-dream/`` (Dream format), each with its TRAINING.md; the held-out test
set of the ``dvoting_arith`` task is ``demo/arith_test.jsonl``.
"""
