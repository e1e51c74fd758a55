"""`hex`: block sizes L/32..L/2 x `hex_samples/5` seeds, `steps = L/2`, vote
(`hex_samples=25`: temperature 0.9; `hex_samples=5`: the original HEX at 0)."""

from __future__ import annotations

from typing import Any

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, Strategy, register
from lm_eval_dvoting.core.parts.samples import QuestionPlan, fixed_steps, fresh_sample

BLOCK_DIVISORS = (32, 16, 8, 4, 2)  # block sizes L/32 .. L/2


@register
class Hex(Strategy):
    name = "hex"
    order = 30
    reads = ("hex_samples",)  # its own block lengths, L/32 .. L/2: no block_length
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
    rules = ("fixed", "dream")
    rule_refusal = (
        "decoder={rule} does not apply to strategy=hex: HEX is defined by its schedules of "
        "`steps` over block sizes L/32..L/2 (LLaDA's fixed schedule, or decoder=dream for "
        "Dream's); leave decoder out for hex"
    )

    @classmethod
    def default_temperature(cls, settings: Any) -> float:
        return 0.9 if settings.hex_samples == 25 else 0.0

    @classmethod
    def steps_run(cls, settings: Any) -> list[int]:
        """One value per block size (L/32 .. L/2)."""
        length = settings.gen_length
        return [fixed_steps(settings.resolved_steps, length, length // d) for d in BLOCK_DIVISORS]

    @classmethod
    def length_problem(cls, settings: Any) -> str | None:
        if settings.gen_length % BLOCK_DIVISORS[0]:
            return (
                "hex needs a generation length divisible by 32 (block sizes L/32..L/2), "
                f"got {settings.gen_length}"
            )
        return None

    @classmethod
    def plan(cls, settings: Any, mask_id: int, same_answer: Any) -> QuestionPlan:
        seeds = settings.hex_samples // len(BLOCK_DIVISORS)
        length, specs = settings.gen_length, []
        steps_run = settings.steps_run or [None] * len(BLOCK_DIVISORS)
        for divisor, steps in zip(BLOCK_DIVISORS, steps_run):
            # block diffusion: each block size with the family's threshold rule
            rule = {} if settings.block_decoding is not None else dict(steps=steps, alpha=None)
            block = length // divisor
            specs += [
                fresh_sample(settings, mask_id, block_length=block, **rule) for _ in range(seeds)
            ]
        yield specs
