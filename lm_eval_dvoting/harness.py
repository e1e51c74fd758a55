"""The lm-eval LM classes `dvoting-llada` and `dvoting-dream`.

This is the only module that imports lm_eval. It parses model args, tokenizes (with
the chat template when `--apply_chat_template` is given), hands token ids to a
strategy (strategies.py), and returns each voted text as a `CostedText` carrying
the request's cost (`nfe`, `n_samples`, `votes`, `trace`). Registration with lm-eval
is done by the plugin hook (plugin.py), by "module:Class" string.

Choices a user of the harness should know (also in the README):
* `--batch_size N` is the number of *rows* decoded per forward pass; a row is one
  sample of one question, so a dVoting batch holds up to N samples of several
  questions. "auto" means 32 rows on a GPU and 8 on a CPU.
* `max_gen_toks` is the generation length L (default 256); the block length defaults
  to L/16 and must divide L.
* The strategy owns the sampling temperature. A task's `do_sample`/`temperature`
  apply to `strategy=single` only (so the harness's self-consistency tasks work as
  a majority-voting baseline); voting strategies ignore them with one warning.
* Each text is cut at the first end-of-text/end-of-turn token, then at the task's
  `until` strings, *before* its answer is extracted, so what is voted is what the
  task's filters see. The answer kind comes from the task's `dvoting_answer` gen kwarg,
  else from the task name (`answers.infer_answer_kind`).
* A context longer than the model's maximum length minus L loses tokens from the
  left (with a warning); an empty context starts from the end-of-text token.
* Samples are seeded from the model arg `seed`, the task, the document, the context
  and the repeat index: results depend neither on `--batch_size` nor on order, nor
  on the number of processes (`torchrun`/`accelerate launch`, see `gather_object`).
* Characters the tokenizer does not know become its unknown token; lone surrogates
  (invalid unicode) become U+FFFD, with one warning.
"""
from __future__ import annotations

import inspect
import logging
import os
from collections import Counter
from dataclasses import asdict, replace
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from tqdm import tqdm

from .answers import answers_equivalent, extract_answer, infer_answer_kind
from .costs import CostedText
from .likelihood import rolling_loglikelihood, score_requests
from .models.loading import load_model, load_tokenizer, resolve_device
from .strategies import StrategySettings, derive_seed, drive

log = logging.getLogger(__name__)

# gen_kwargs this model understands; anything else is rejected with this list
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "dvoting_answer")
AUTO_BATCH_ROWS = {"cuda": 32, "cpu": 8}


class DVotingEvalModel(TemplateLM):
    """A diffusion LM evaluated with a voting strategy (single, majority, hex, dvoting)."""

    default_pretrained = ""

    def __init__(
        self,
        pretrained: str | None = None,
        tokenizer: str | None = None,
        strategy: str = "dvoting",
        n: int = 5,
        alpha: float = 0.3,
        temperature: float | None = None,
        tau: float = 1.0,
        block_length: int | None = None,
        steps: int | None = None,
        remasking: str = "low_confidence",
        hex_samples: int = 25,
        prefix_cache: bool | str = False,
        seed: int = 1234,
        dtype: str | None = None,
        max_gen_toks: int = 256,
        max_length: int | None = None,
        mc_num: int = 128,
        batch_size: int | str = 1,
        max_batch_size: int | None = None,
        device: str | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            accepted = [p for p in inspect.signature(DVotingEvalModel.__init__).parameters
                        if p not in ("self", "unknown")]
            raise ValueError(
                f"unknown model args {sorted(unknown)}; accepted model args are: {', '.join(accepted)}"
            )
        # Validates every setting once, at construction, with the default length.
        self.settings = StrategySettings(
            strategy=strategy, gen_length=int(max_gen_toks), block_length=block_length, n=int(n),
            alpha=float(alpha), temperature=None if temperature is None else float(temperature),
            tau=float(tau), steps=steps, remasking=remasking, hex_samples=int(hex_samples),
            prefix_cache=_flag("prefix_cache", prefix_cache),
        )
        self.pretrained = pretrained or self.default_pretrained
        self.seed = int(seed)
        self.mc_num = int(mc_num)
        self._setup_processes(device)
        self.model = load_model(self.pretrained, device=self._device, dtype=dtype)
        if self.model.family != self.family:
            log.warning("checkpoint %s is a %s model, loaded by dvoting-%s", self.pretrained,
                        self.model.family, self.family)
        self.tokenizer = load_tokenizer(tokenizer or self.pretrained)
        self._tokenizer_source = tokenizer or self.pretrained
        self.max_length = int(max_length or self.model.max_length)
        self.batch_rows = self._parse_batch_size(batch_size, max_batch_size)
        self._warned_sampling = False
        self.totals: Counter[str] = Counter()
        self._unshared: Counter[str] = Counter()  # this rank's part of the totals not yet sent to rank 0
        # the settings requests really ran with (a task's max_gen_toks sets their length)
        self._settings_used: list[StrategySettings] = []

    # ---------------------------------------------------------------- set-up

    family = ""

    def _setup_processes(self, device: str | None) -> None:
        """One process, or one rank of `torchrun`/`accelerate launch` (data parallel)."""
        self.accelerator = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import Accelerator

            self.accelerator = Accelerator()
            self._device = self.accelerator.device
            self._rank = self.accelerator.process_index
            self._world_size = self.accelerator.num_processes
        else:
            self._device = resolve_device(device)
            self._rank, self._world_size = 0, 1

    def _parse_batch_size(self, batch_size: int | str, max_batch_size: int | None) -> int:
        if str(batch_size).startswith("auto"):
            rows = AUTO_BATCH_ROWS["cuda" if self._device.type == "cuda" else "cpu"]
            return min(rows, int(max_batch_size)) if max_batch_size else rows
        try:
            rows = int(batch_size)
        except ValueError:
            raise ValueError(f"batch_size must be a positive integer or 'auto', got {batch_size!r}") from None
        if rows < 1:
            raise ValueError(f"batch_size must be >= 1, got {rows}")
        return rows

    def use_strategy(self, strategy: str) -> None:
        """Switch strategy on the loaded model (e.g. to compare them) and reset the totals."""
        self.settings = replace(self.settings, strategy=strategy)
        self.totals, self._unshared = Counter(), Counter()
        self._settings_used = []

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    # Data parallel: lm-eval splits the documents by rank, pads the ranks to equal
    # request counts by repeating a request (generate_until decodes such copies once),
    # gathers the per-sample metrics with `gather_object` on every rank after all
    # requests, then calls `get_model_info` on rank 0 only. The cost totals travel to
    # rank 0 with that gather: no extra collective inside generate_until, which a rank
    # whose requests all come from the `--use_cache` cache never even calls.

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.accelerator is None else self.accelerator.gather(tensor)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        if self.accelerator is None:
            return [obj]
        import torch.distributed as dist

        gathered = [None] * self.world_size if self.rank == dst else None
        dist.gather_object((obj, dict(self._unshared)), gathered, dst=dst)
        self._unshared = Counter()
        if gathered is None:
            return None
        for rank, (_, totals) in enumerate(gathered):
            if rank != self.rank:
                self.totals.update(totals)
        return [item for item, _ in gathered]

    def barrier(self) -> None:
        if self.accelerator is not None:
            self.accelerator.wait_for_everyone()

    @property
    def eot_token_id(self) -> int:
        return int(self.model.end_token_ids[0])

    @property
    def tokenizer_name(self) -> str:
        return str(self._tokenizer_source).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tokenizer.encode(_encodable(string), add_special_tokens=bool(add_special_tokens))

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    # ------------------------------------------------------------ generation

    def _request_settings(self, gen_kwargs: dict[str, Any], task_name: str | None) -> tuple[StrategySettings, list[str], str]:
        """Per-request settings, stop strings and answer kind from the task's gen_kwargs."""
        kwargs = dict(gen_kwargs or {})
        unknown = sorted(set(kwargs) - set(GEN_KWARGS))
        if unknown:
            raise ValueError(
                f"unknown generation kwargs {unknown} (task {task_name}); accepted: {', '.join(GEN_KWARGS)}"
            )
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        settings = self.settings
        if "max_gen_toks" in kwargs:
            length = int(kwargs["max_gen_toks"])
            block = settings.block_length if settings.block_length is not None else max(1, length // 16)
            if length % block:
                raise ValueError(
                    f"max_gen_toks {length} (task {task_name}) is not a multiple of the block length {block}; "
                    "set --gen_kwargs max_gen_toks=... or the model arg block_length to fit"
                )
            settings = replace(settings, gen_length=length)
        if kwargs.get("do_sample") and float(kwargs.get("temperature") or 0) > 0:
            if settings.strategy == "single":
                settings = replace(settings, temperature=float(kwargs["temperature"]))
            elif not self._warned_sampling:
                log.warning("task %s asks for sampling; strategy=%s sets its own temperature "
                            "(model arg temperature=%s), so the task's is ignored",
                            task_name, settings.strategy, settings.resolved_temperature)
                self._warned_sampling = True
        kind = infer_answer_kind(task_name, kwargs.get("dvoting_answer"))
        return settings, until, kind

    def _prompt_ids(self, context: str, gen_length: int) -> torch.Tensor:
        ids = self.tok_encode(context) if context else []
        if not ids:
            ids = [self.eot_token_id]  # an empty context starts from end-of-text
        room = self.max_length - gen_length
        if room < 1:
            raise ValueError(f"max_gen_toks {gen_length} leaves no room for a prompt in {self.max_length} tokens")
        if len(ids) > room:
            log.warning("context of %d tokens cut from the left to %d to fit %d generated tokens",
                        len(ids), room, gen_length)
            ids = ids[-room:]
        return torch.tensor(ids, dtype=torch.long)

    def generated_text(self, tokens: torch.Tensor, until: list[str]) -> str:
        """Decoded text up to the first end token, then cut at the first `until` string."""
        end_ids = set(self.model.end_token_ids)
        ids = tokens.tolist()
        cut = next((i for i, t in enumerate(ids) if t in end_ids), len(ids))
        text = self.tokenizer.decode(ids[:cut], skip_special_tokens=True)
        for stop in until:
            if stop:
                text = text.split(stop)[0]
        return text

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        occurrences: Counter[int] = Counter()
        first_of: dict[tuple[int, int], int] = {}  # (request, repeat index) -> its first position
        copy_of: dict[int, int] = {}  # position of a padding copy -> the position it repeats
        prompts, settings, extracts, seeds, untils = [], [], [], [], []
        for position, req in enumerate(requests):
            repeat = occurrences[id(req)]  # `repeats: N` sends the same instance N times
            occurrences[id(req)] += 1
            if getattr(req, "repeats", None):
                # with several processes lm-eval pads a rank's list by repeating its last
                # instance `repeats` times more: decode (and count) each repeat once
                repeat %= req.repeats
            if (id(req), repeat) in first_of:
                copy_of[position] = first_of[id(req), repeat]
                continue
            first_of[id(req), repeat] = position
            context, gen_kwargs = req.args
            request_settings, until, kind = self._request_settings(gen_kwargs, req.task_name)
            if request_settings not in self._settings_used:
                self._settings_used.append(request_settings)
            prompts.append(self._prompt_ids(context, request_settings.gen_length))
            settings.append(request_settings)
            untils.append(until)
            seeds.append(derive_seed(self.seed, req.task_name, req.doc_id, context, repeat))

            def extract(tokens: torch.Tensor, until: list[str] = until, kind: str = kind) -> Any:
                answer = extract_answer(self.generated_text(tokens, until), kind)
                return None if answer is None else (kind, answer)

            extracts.append(extract)

        jobs = [p for p in range(len(requests)) if p not in copy_of]  # job j answers requests[jobs[j]]
        # longest prompts first, as lm-eval does, so padding stays small
        order = sorted(range(len(jobs)), key=lambda j: -(prompts[j].numel() + settings[j].gen_length))
        texts: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(jobs), desc="dVoting generate_until", disable=disable_tqdm or self.rank != 0)

        def done(position: int, result: Any) -> None:
            j = order[position]
            text = self.generated_text(result.samples[result.chosen], untils[j])
            texts[jobs[j]] = self._costed(text, result, untils[j])
            context, gen_kwargs = requests[jobs[j]].args
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), texts[jobs[j]])
            bar.update(1)

        drive(
            self.model,
            [prompts[j] for j in order],
            [settings[j] for j in order],
            [extracts[j] for j in order],
            [seeds[j] for j in order],
            same_answer=_same_answer,
            max_rows=self.batch_rows,
            on_done=done,
        )
        bar.close()
        for position, first in copy_of.items():
            texts[position] = texts[first]
        return texts  # type: ignore[return-value]

    def _costed(self, text: str, result: Any, until: list[str]) -> CostedText:
        votes = {answer[1]: count for answer, count in result.votes}
        trace = {
            "candidates": [
                {
                    "text": self.generated_text(sample, until),
                    "answer": None if answer is None else answer[1],
                    "nfe": nfe,
                    "kept_positions": kept,
                    # generation-region token ids, for token-level measures (NUPR@k, pictures)
                    "tokens": sample.tolist(),
                }
                for sample, answer, nfe, kept in zip(result.samples, result.answers, result.sample_nfe, result.kept)
            ],
            "votes": votes,
            "chosen": result.chosen,
        }
        self.totals.update(requests=1, nfe=result.nfe, samples=len(result.answers))
        self._unshared.update(requests=1, nfe=result.nfe, samples=len(result.answers))
        return CostedText(text, nfe=result.nfe, n_samples=len(result.answers), votes=votes, trace=trace)

    # ------------------------------------------------------------ likelihood

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        pairs = [(torch.tensor(ctx, dtype=torch.long), torch.tensor(cont, dtype=torch.long))
                 for _, ctx, cont in requests]
        seeds = [derive_seed(self.seed, "loglikelihood", ctx, cont) for _, ctx, cont in requests]
        bar = tqdm(total=len(requests), desc="dVoting loglikelihood", disable=disable_tqdm or self.rank != 0)
        results = score_requests(self.model, pairs, mc_num=self.mc_num, batch_size=self.batch_rows,
                                 seeds=seeds, progress=bar.update)
        bar.close()
        for (string_pair, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", string_pair, result)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        scores = []
        for req in tqdm(requests, desc="dVoting loglikelihood_rolling", disable=disable_tqdm or self.rank != 0):
            (text,) = req.args
            ids = torch.tensor(self.tok_encode(text), dtype=torch.long)
            score = rolling_loglikelihood(self.model, ids, mc_num=self.mc_num,
                                          seed=derive_seed(self.seed, "rolling", text),
                                          prefix_ids=torch.tensor([self.prefix_token_id]),
                                          batch_size=self.batch_rows)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), score)
            scores.append(score)
        return scores

    # ----------------------------------------------------------- reporting

    def get_model_info(self) -> dict[str, Any]:
        """Lands in the results' `config`: the resolved settings and the cost totals.

        ``settings`` are the model args' (generation length: ``max_gen_toks``'s default);
        ``settings_used`` lists the settings requests really ran with since the model was
        made or its strategy switched, with the task's ``max_gen_toks`` as their length.
        """
        totals = dict(self.totals)
        if totals.get("requests"):
            totals["mean_nfe"] = totals["nfe"] / totals["requests"]
            totals["mean_samples"] = totals["samples"] / totals["requests"]
        return {
            "dvoting": {
                "pretrained": self.pretrained,
                "family": self.model.family,
                "seed": self.seed,
                "mc_num": self.mc_num,
                "batch_rows": self.batch_rows,
                "settings": _resolved(self.settings),
                "settings_used": [_resolved(s) for s in self._settings_used],
                "totals": totals,
            }
        }


def _resolved(settings: StrategySettings) -> dict[str, Any]:
    """`settings` as a dict, with the per-strategy defaults filled in."""
    return asdict(settings) | {
        "block_length": settings.resolved_block_length,
        "temperature": settings.resolved_temperature,
        "steps": settings.resolved_steps,
    }


def _flag(name: str, value: bool | str) -> bool:
    """A boolean model arg given as a bool or as true/false text."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _encodable(text: str) -> str:
    """`text` with lone surrogates (from broken data; no tokenizer accepts them) as U+FFFD.

    Surrogate pairs become the character they encode; valid text is returned as it is.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        if not _encodable.warned:
            log.warning("text with lone surrogates (invalid unicode): they are replaced by U+FFFD")
            _encodable.warned = True
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


_encodable.warned = False


def _same_answer(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Answers carry their kind: math answers group by equivalence, others by equality."""
    return a[0] == b[0] and answers_equivalent(a[1], b[1], a[0])


class LLaDAEvalModel(DVotingEvalModel):
    """`--model dvoting-llada`: LLaDA-8B-Instruct / LLaDA-1.5 (or any LLaDA-format folder)."""

    family = "llada"
    default_pretrained = "GSAI-ML/LLaDA-8B-Instruct"


class DreamEvalModel(DVotingEvalModel):
    """`--model dvoting-dream`: Dream-v0-Instruct-7B (or any Dream-format folder)."""

    family = "dream"
    default_pretrained = "Dream-org/Dream-v0-Instruct-7B"

