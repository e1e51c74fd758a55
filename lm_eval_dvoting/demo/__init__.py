"""The offline demo: synthetic arithmetic problems, a character tokenizer, and the
training scripts of the tiny masked-diffusion models shipped as ``pretrained=tiny-arith``
(and ``tiny-arith-dream``) and of their LoRA adapter ``peft=tiny-arith-lora``.

- `arith`: the seeded problem generator and the paper's GSM8K-style prompt;
- `tokenizer`: the character-level tokenizer in transformers' format;
- `train`: ``python -m lm_eval_dvoting.demo.train --help``;
- `sweep`: scores checkpoints on the validation problems, to choose the shipped one;
- `train_adapter`: ``python -m lm_eval_dvoting.demo.train_adapter --help`` (the adapter,
  the policy of the demo's RFG row).

The shipped checkpoints live in ``demo/tiny-arith/`` (LLaDA format),
``demo/tiny-arith-dream/`` (Dream format) and ``demo/tiny-arith-lora/`` (the adapter),
each with its TRAINING.md; the held-out test set of the ``dvoting_arith`` task is
``demo/arith_test.jsonl``.
"""
