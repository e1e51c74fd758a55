"""The one-sample decoder: masked-diffusion decoding of a batch of rows.

Semantics (docs/ALGORITHM.md section 1; block diffusion for LLaDA2 in `blocks.py`): each step is
one forward pass over prompt + generation region; the mask token's logit is suppressed;
candidates are the argmax (temperature 0) or LLaDA's float64 Gumbel-max (temperature > 0);
only masked positions of a row's leftmost unfinished block may be committed. The units, each
importing only those below it (no circle):

| floor | module | owns |
|---|---|---|
| 3 | `rows.py` | the row batch (`RowDecoder`): rows enter and leave between steps; one |
|   |           | pass per step; `generate()` |
| 2 | `rules.py` | what the commit rules share (`RowWork`); the rules (fixed schedule, |
|   |            | entropy threshold, confidence threshold) are `core/parts/rules/` |
| 2 | `blocks.py` | block diffusion (LLaDA2.0/2.1): a row's block-aligned layout and its |
|   |             | threshold / joint-threshold rule |
| 2 | `caches.py` | the cache policies (`none`, `prefix`, `dual`, `block`): what a pass |
|   |             | covers and keeps; lazy logits |
| 2 | `full_steps.py` | `none`'s full passes as CUDA graphs (`cached_steps`) |
| 2 | `static_steps.py` | the reuse passes of `prefix`/`dual` over fixed buffers, and |
|   |                   | their CUDA graphs (`cached_steps`) |
| 1 | `kept.py` | a row's kept keys and values: their layout in a reuse pass |
| 1 | `state.py` | the row, the result, the settings' checks, the float64 numerics |

Which rule, cache policy, strategy and vote a decode uses, and what each reads and can do,
is declared in `core/parts/` (one file per part).

Rows are independent: each has its own prompt length, generation length, block
length, rule, temperature, cache policy and random generator, so a row decodes to the
same tokens alone or inside any batch in float32 (tested; the attention kernel sums a
padded row in another order, so logits may move by ~1e-7 relative, which has flipped no
decision in any test or in docs/batch_invariance.md). In bfloat16/float16 the same
reordering moves a row's numbers by one unit in the last place (2^-8 relative in
bfloat16; on a GPU kernels are also chosen by shape), which flips decisions at
near-ties; everything from the logits on (softmax, entropy, confidence, Gumbel noise)
runs in float64 whatever the model dtype.

Cost: the forward pass runs once per step for all active rows; the output head,
softmax, entropy and noise are computed only at the positions of the block(s) that
can be committed in that step, never over the whole sequence times the vocabulary,
with one head call per round for all rows. The fixed schedule draws the block's noise at
all its masked positions (the noisy candidates decide, through their confidence, which
positions commit); the entropy rule decides from the un-noised logits, so it draws
noise only for the positions it commits.

Random streams: every draw comes from the row's generator, so a seed fixes a row's
tokens whatever the batch. The stream is not the release's (which draws noise over
the whole batch x sequence x vocabulary at every step); the distribution of every
committed token is.
"""

from lm_eval_dvoting.core.decoding.rows import RowDecoder, generate
from lm_eval_dvoting.core.decoding.state import (
    CACHE_POLICIES,
    REMASKING_RULES,
    BlockDecoding,
    DecodeResult,
    DecodeRow,
    DreamDecoding,
    check_prompt_batch,
    default_block_length,
    validate_row_settings,
)

__all__ = [
    "CACHE_POLICIES",
    "REMASKING_RULES",
    "BlockDecoding",
    "DecodeResult",
    "DecodeRow",
    "DreamDecoding",
    "RowDecoder",
    "check_prompt_batch",
    "default_block_length",
    "generate",
    "validate_row_settings",
]
