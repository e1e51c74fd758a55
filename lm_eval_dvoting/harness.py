"""The lm-eval LM classes `dvoting-llada` and `dvoting-dream`.

This is the only module that imports lm_eval (besides result_cache.py, which binds
`--use_cache` to the run's settings, and task_costs.py, which makes every task report
its cost per question; installed when this module is imported). It parses model args,
tokenizes (with the chat template when `--apply_chat_template` is given), hands token
ids to a strategy (strategies.py), and returns each voted text as a `CostedText` carrying
the request's cost and settings (`nfe`, `n_samples`, `votes`, `trace`, `settings`). Registration with lm-eval
is done by the plugin hook (plugin.py), by "module:Class" string.

Choices a user of the harness should know (also in the README):
* `--batch_size N` is the number of *rows* decoded per forward pass; a row is one
  sample of one question, so a dVoting batch holds up to N samples of several
  questions. "auto" means 32 rows on a GPU and 8 on a CPU.
* `max_gen_toks` is the generation length L (default 256); the block length defaults
  to L/16 and must divide L.
* The strategy owns the sampling temperature. A task's `do_sample`/`temperature`
  apply to `strategy=single` only (so the harness's self-consistency tasks work as
  a majority-voting baseline); a value the strategy does not use gets one warning per
  run (`_task_sampling`).
* Each text is cut at the first end-of-text/end-of-turn token, then at the task's
  `until` strings, *before* its answer is extracted, so what is voted is what the
  task's filters see. The answer kind comes from the task's `dvoting_answer` gen kwarg,
  else from the task name (`answers.infer_answer_kind`).
* A context longer than the model's maximum length minus L loses tokens from the
  left (with a warning); an empty context starts from the end-of-text token.
* Samples are seeded from the run's seed (the model arg `seed`, else lm-eval's
  `--seed` torch seed, else 1234: `sampling_seed`), the task, the document, the context
  and the repeat index: no random draw depends on `--batch_size`, on order or on the
  number of processes (`torchrun`/`accelerate launch`, see `gather_object`). In float32
  on a CPU the results do not either (tested). In bfloat16/float16 a row's logits change
  in the last bit with the padding of the rows beside it (the CPU attention kernel's
  summation order), which flips near-tie decisions: a few questions in a hundred may
  change with `--batch_size` (docs/batch_invariance.md); `get_model_info` records
  `dtype`, `device` and `batch_rows` so a run can be repeated exactly.
* lm-eval's run-wide `device`/`batch_size` and the same model args merge without clashes
  (`merge_run_args`); HFLM's model args are honoured or refused by name (README table).
* Characters the tokenizer does not know become its unknown token. Lone surrogates
  (invalid unicode, from a prompt template or function) become U+FFFD in the request
  itself before any model work (`sanitise_requests`, one warning per call), so
  lm-eval's `--log_samples` hashing and logging, which run after all generation and
  would fail on them, see the text the model saw.
* Model args are validated before the checkpoint is read: whole numbers by
  `_whole_number` (5, "5", 5.0; not 2.5, "abc", True), ranges by `StrategySettings`.
"""
from __future__ import annotations

import difflib
import inspect
import logging
import numbers
import os
import sys
from collections import Counter
from dataclasses import asdict, replace
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from tqdm import tqdm

from .answers import answers_equivalent, extract_answer, infer_answer_kind
from .costs import CostedText
from .likelihood import rolling_loglikelihood, score_requests
from .result_cache import bind as bind_result_cache, generation_key_args, repeat_indices
from .models.loading import hub_revision, load_model, load_tokenizer, resolve_checkpoint, resolve_device
from .decoding import default_block_length
from .strategies import StrategySettings, derive_seed, drive
from .task_costs import RunCosts, install as _install_task_costs

log = logging.getLogger(__name__)
# every task a dvoting model runs reports its cost per question (mean NFE, samples)
_install_task_costs()

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
        decoder: str | None = None,
        cache: str = "none",
        seed: int | None = None,
        dtype: str | None = None,
        max_gen_toks: int = 256,
        max_length: int | None = None,
        mc_num: int = 128,
        batch_size: int | str = 1,
        max_batch_size: int | None = None,
        device: str | None = None,
        # HFLM's habits (`--model hf`): honoured, or refused with their own message
        revision: str | None = None,
        subfolder: str | None = None,
        trust_remote_code: bool | str = False,
        use_fast_tokenizer: bool | str = True,
        add_bos_token: bool | str = False,
        **unknown: Any,
    ) -> None:
        super().__init__()
        _refuse_unknown_args(unknown)
        hf_args = _hflm_args(trust_remote_code, use_fast_tokenizer, add_bos_token)
        # Validates every setting once, at construction, with the default length.
        self.settings = StrategySettings(
            strategy=strategy, gen_length=_whole_number("max_gen_toks", max_gen_toks),
            block_length=None if block_length is None else _whole_number("block_length", block_length),
            n=_whole_number("n", n), alpha=_real_number("alpha", alpha),
            temperature=None if temperature is None else _real_number("temperature", temperature),
            tau=_real_number("tau", tau), steps=None if steps is None else _whole_number("steps", steps),
            remasking=remasking, hex_samples=_whole_number("hex_samples", hex_samples, allowed="25 or 5"),
            prefix_cache=_flag("prefix_cache", prefix_cache), decoder=decoder, cache=cache,
        )
        self.pretrained = pretrained or self.default_pretrained
        # the sampling seed and where it came from ("model_args", "lm-eval --seed", "default")
        self.seed, self.seed_source = sampling_seed(seed)
        # what `use_strategy` starts from, so one switch's overrides never leak into the next
        self._built_settings, self._built_seed = self.settings, (self.seed, self.seed_source)
        self.mc_num = _whole_number("mc_num", mc_num, 1)
        max_length = None if max_length is None else _whole_number("max_length", max_length, 1)
        self._setup_processes(device)
        # parsed before the checkpoint is read: a bad batch size fails at once
        self.batch_rows = self._parse_batch_size(batch_size, max_batch_size)
        # one resolution of the checkpoint, so config, weights and tokenizer come from the
        # same snapshot (a hub branch that moves between two look-ups cannot mix them)
        folder = resolve_checkpoint(self.pretrained, revision=revision, subfolder=subfolder)
        self.revision = hub_revision(folder)  # the hub commit loaded; None for a local folder
        self.subfolder = subfolder or None
        # the tokenizer first: it is cheap, and add_bos_token is checked against it
        self.tokenizer = load_tokenizer(tokenizer or folder)
        self._tokenizer_source = tokenizer or self.pretrained
        self.add_bos_token = _bos_setting(hf_args["add_bos_token"], self.tokenizer, tokenizer or self.pretrained)
        self.model = load_model(folder, device=self._device, dtype=dtype)
        if self.model.family != self.family:
            log.warning("checkpoint %s is a %s model, loaded by dvoting-%s", self.pretrained,
                        self.model.family, self.family)
        if max_length is not None and max_length > self.model.max_length:
            # longer prompts would be refused by the decoder mid-run, after other requests' work
            raise ValueError(f"max_length {max_length} exceeds the model's maximum length {self.model.max_length}: "
                             f"give max_length <= {self.model.max_length}, or leave it out for the model's")
        self.max_length = int(max_length or self.model.max_length)
        self._ignored_sampling: set[tuple[Any, ...]] = set()  # task sampling values reported as unused
        self.totals: Counter[str] = Counter()
        self._unshared: Counter[str] = Counter()  # this rank's part of the totals not yet sent to rank 0
        # the settings requests really ran with (a task's max_gen_toks sets their length)
        self._settings_used: list[StrategySettings] = []
        self._run_costs: RunCosts | None = None  # the last evaluation's cost ledger (task_costs.py)

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
            if device is not None and torch.device(device).type != self._device.type:
                # each rank runs where accelerate puts it; a device asked for elsewhere is not honoured
                raise ValueError(
                    f"device {device!r} was asked for, but under torchrun/accelerate each rank runs on the "
                    f"device accelerate gives it ({self._device}): drop --device/device=, or for the CPU "
                    "set ACCELERATE_USE_CPU=1"
                )
        else:
            self._device = resolve_device(device)
            self._rank, self._world_size = 0, 1

    def _parse_batch_size(self, batch_size: int | str, max_batch_size: int | None) -> int:
        if str(batch_size).startswith("auto"):
            rows = AUTO_BATCH_ROWS["cuda" if self._device.type == "cuda" else "cpu"]
            return min(rows, _whole_number("max_batch_size", max_batch_size, 1)) if max_batch_size else rows
        try:
            return _whole_number("batch_size", batch_size, 1)
        except ValueError:
            raise ValueError(f"batch_size must be a positive integer or 'auto', got {batch_size!r}") from None

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None) -> DVotingEvalModel:
        """What lm-eval calls with the model args and its run-wide `device`/`batch_size` (`merge_run_args`)."""
        return cls(**merge_run_args(dict(arg_dict), additional_config or {}))

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> DVotingEvalModel:
        """As `create_from_arg_obj`, from lm-eval's `key=value,...` model args text."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    def use_strategy(self, strategy: str, seed: int | None = None, **overrides: Any) -> None:
        """Switch strategy on the loaded model (e.g. to compare them) and reset the totals.

        `overrides` replace other settings too (e.g. `decoder="entropy"`, `temperature=0.6`;
        checked as at construction); `seed`, when given, becomes the sampling seed of the
        evaluations that follow (`dvoting compare --seeds K`). Both apply to the settings and
        seed the model was built with, not to an earlier switch's: `use_strategy("majority")`
        after `use_strategy("majority", decoder="entropy")` is plain majority again."""
        self.settings = replace(self._built_settings, strategy=strategy, **overrides)
        self.seed, self.seed_source = self._built_seed
        if seed is not None:
            self.seed = _whole_number("seed", seed)
            self.seed_source = "use_strategy"
        self.totals, self._unshared = Counter(), Counter()
        self._ignored_sampling = set()
        self._settings_used = []
        self._run_costs = None

    def begin_cost_run(self) -> RunCosts:
        """A fresh cost ledger for the evaluation starting now (called by lm-eval's `evaluate`,
        as patched by task_costs.py); `get_model_info` reports it afterwards."""
        self._run_costs = RunCosts()
        self._computed_before = Counter(self.totals)
        return self._run_costs

    @property
    def dtype_name(self) -> str:
        """The loaded weights' dtype, e.g. "bfloat16" (what decides batch dependence)."""
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

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
        run_part = self._run_costs.take_unsent() if self._run_costs is not None else None
        dist.gather_object((obj, dict(self._unshared), run_part), gathered, dst=dst)
        self._unshared = Counter()
        if gathered is None:
            return None
        for rank, (_, totals, part) in enumerate(gathered):
            if rank != self.rank:
                self.totals.update(totals)
                if part is not None and self._run_costs is not None:
                    self._run_costs.merge(part)
        return [item for item, _, _ in gathered]

    def set_cache_hook(self, cache_hook: Any) -> None:
        """`--use_cache`: results keyed on this run's settings and on each document and repeat
        (result_cache.py); lm-eval's own request-only lookup is bypassed."""
        self.cache_hook = bind_result_cache(self, cache_hook)

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
        ids = self.tokenizer.encode(_encodable(string), add_special_tokens=bool(add_special_tokens))
        # add_bos_token (HFLM's model arg) applies when the caller does not decide, and never
        # doubles a BOS that the text (e.g. a chat template) already starts with
        bos = self.tokenizer.bos_token_id
        if add_special_tokens is None and self.add_bos_token and ids[:1] != [bos]:
            ids = [bos, *ids]
        return ids

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
            length = _whole_number("max_gen_toks", kwargs["max_gen_toks"], 1)
            block = settings.block_length if settings.block_length is not None else default_block_length(length)
            if length % block:
                raise ValueError(
                    f"max_gen_toks {length} (task {task_name}) is not a multiple of the block length {block}; "
                    "set --gen_kwargs max_gen_toks=... or the model arg block_length to fit"
                )
            settings = replace(settings, gen_length=length)
        settings = self._task_sampling(settings, kwargs, task_name)
        kind = infer_answer_kind(task_name, kwargs.get("dvoting_answer"))
        return settings, until, kind

    def _task_sampling(self, settings: StrategySettings, kwargs: dict[str, Any], task_name: str | None) -> StrategySettings:
        """A task's (or `--gen_kwargs`') `do_sample`/`temperature`: used by `strategy=single`, else reported.

        `strategy=single` samples at the task's temperature when `do_sample` is true and the
        temperature above 0 (as HF generate does), so `gsm8k-cot-self-consistency` works as
        the harness's own majority baseline. Every other value is not used: the strategy
        samples at its own temperature (the model arg `temperature`). Such a value is
        reported once per run and per distinct value, never per request: a request for
        sampling or for a temperature as a WARNING; the greedy request every stock task
        carries by default (`do_sample: false`) only at INFO, as voting strategies sample by
        design.
        """
        asked = {key: kwargs[key] for key in ("do_sample", "temperature") if key in kwargs}
        if not asked:
            return settings
        do_sample = asked.get("do_sample") is not None and _flag("do_sample", asked["do_sample"])
        try:
            temperature = float(asked.get("temperature") or 0)
        except (TypeError, ValueError):
            raise ValueError(f"generation kwarg temperature must be a number, got {asked['temperature']!r} "
                             f"(task {task_name})") from None
        single = settings.strategy == "single"
        if single and do_sample and temperature > 0:
            return replace(settings, temperature=temperature)
        runs_at = settings.resolved_temperature
        greedy_ask = not do_sample and temperature == 0
        if single and greedy_ask and runs_at == 0:
            return settings  # asked for greedy decoding, and that is what runs
        key = (settings.strategy, tuple(sorted((k, str(v)) for k, v in asked.items())))
        if key in self._ignored_sampling:
            return settings
        self._ignored_sampling.add(key)
        if not single:
            why = f"strategy={settings.strategy} samples at its own temperature {runs_at}"
        elif not do_sample and temperature > 0:
            why = (f"strategy=single samples only with do_sample=true (as HF generate does), "
                   f"so it runs at temperature {runs_at}")
        elif do_sample:
            why = f"do_sample=true needs a temperature above 0; strategy=single runs at temperature {runs_at}"
        else:
            why = f"the model arg temperature={runs_at} is used"
        message = (f"generation kwargs {asked} (task {task_name}: its YAML or --gen_kwargs) are not used: "
                   f"{why}; set the model arg temperature (--model_args temperature=...) to choose it"
                   + (", or pass do_sample=true with the temperature" if single else ""))
        if greedy_ask:
            log.info(message)
        else:
            log.warning(message)
        return settings

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
        sanitise_requests(requests)
        first_of: dict[tuple[int, int], int] = {}  # (request, repeat index) -> its first position
        copy_of: dict[int, int] = {}  # position of a padding copy -> the position it repeats
        prompts, settings, extracts, seeds, untils = [], [], [], [], []
        # `repeats: N` sends the same instance N times; lm-eval's padding copies for data
        # parallel repeat the first ones: decode (and count) each repeat once
        for position, (req, repeat) in enumerate(zip(requests, repeat_indices(requests))):
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
        repeat_of = {position: repeat for (_, repeat), position in first_of.items()}
        # longest prompts first, as lm-eval does, so padding stays small
        order = sorted(range(len(jobs)), key=lambda j: -(prompts[j].numel() + settings[j].gen_length))
        texts: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(jobs), desc="dVoting generate_until", disable=disable_tqdm or self.rank != 0)

        def done(position: int, result: Any) -> None:
            j = order[position]
            text = self.generated_text(result.samples[result.chosen], untils[j])
            texts[jobs[j]] = self._costed(text, result, untils[j], settings[j])
            # keyed on the repeat too: each repeat has its own seed (result_cache.py)
            self.cache_hook.add_partial("generate_until", generation_key_args(requests[jobs[j]], repeat_of[jobs[j]]),
                                        texts[jobs[j]])
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

    def _costed(self, text: str, result: Any, until: list[str], settings: StrategySettings | None = None) -> CostedText:
        """The response: the voted text with its request's cost, trace and settings.

        The settings travel with the text (and so into `--use_cache`), so that a rerun
        served from the cache reports the same `settings_used` and totals (task_costs.py).
        """
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
        used = None if settings is None else _resolved(settings) | {"seed": self.seed}
        return CostedText(text, nfe=result.nfe, n_samples=len(result.answers), votes=votes, trace=trace,
                          settings=used)

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

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        sanitise_requests(requests)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        sanitise_requests(requests)
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

        ``settings`` are the model args' (generation length: ``max_gen_toks``'s default).
        After an evaluation (lm-eval's `evaluate`) the rest describes the responses its
        results are built on, computed or read from `--use_cache` alike (task_costs.py):
        ``settings_used`` the settings they ran with (the task's ``max_gen_toks`` as their
        length), ``totals`` their cost (``questions``, ``requests`` (one per repeat), ``nfe``,
        ``samples``, and ``mean_nfe``/``mean_samples`` per request), ``tasks`` the same sums
        per task, and ``computed`` the part of the totals this run decoded (the rest came
        from the cache). Before any evaluation (`generate_until` called directly) they count
        the requests computed since the model was made or its strategy switched.
        """
        return {
            "dvoting": {
                "pretrained": self.pretrained,
                "family": self.model.family,
                # hub commit loaded (None: a local folder or packaged checkpoint)
                "revision": self.revision,
                "subfolder": self.subfolder,
                "seed": self.seed,
                # "model_args" (the model arg seed), "lm-eval --seed" (the run's torch seed) or "default"
                "seed_source": self.seed_source,
                "mc_num": self.mc_num,
                "batch_rows": self.batch_rows,
                # outputs in bfloat16/float16 can depend on the batch (README, Reproducibility):
                # dtype, device and batch_rows are what a rerun must repeat
                "dtype": self.dtype_name,
                "device": "cpu" if self._device.type == "cpu" else str(self._device),  # a CPU rank is "cpu:0"
                "settings": _resolved(self.settings),
                **self._cost_report(),
            }
        }

    def _cost_report(self) -> dict[str, Any]:
        """``settings_used``, ``totals``, ``tasks`` and ``computed`` for `get_model_info`."""
        figures = ("requests", "nfe", "samples")
        if self._run_costs is None:
            totals: dict[str, Any] = {key: self.totals[key] for key in figures}
            used = [_resolved(s) | {"seed": self.seed} for s in self._settings_used]
            tasks: dict[str, Any] = {}
            computed = dict(totals)
        else:
            totals = self._run_costs.totals()
            used = self._run_costs.settings_used()
            tasks = self._run_costs.by_task()
            computed = {key: self.totals[key] - self._computed_before[key] for key in figures}
        if totals["requests"] and "mean_nfe" not in totals:
            totals["mean_nfe"] = totals["nfe"] / totals["requests"]
            totals["mean_samples"] = totals["samples"] / totals["requests"]
        return {"settings_used": used, "totals": totals, "tasks": tasks, "computed": computed}


def _resolved(settings: StrategySettings) -> dict[str, Any]:
    """`settings` as a dict, with the per-strategy defaults filled in."""
    return asdict(settings) | {
        "block_length": settings.resolved_block_length,
        "temperature": settings.resolved_temperature,
        "steps": settings.resolved_steps,
        "steps_run": settings.steps_run,  # `steps` as the schedule really runs it (rounded up per block)
        "decoder": settings.resolved_decoder,
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


def _whole_number(name: str, value: Any, minimum: int | None = None, allowed: str | None = None) -> int:
    """A whole-number model arg: 5, "5" and 5.0 give 5; 2.5, "abc", True, inf are refused.

    `int()` would truncate 2.5 to 2 silently and fail on "abc" with a bare message.
    """
    number: Any = value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    allowed = allowed or "a whole number" + ("" if minimum is None else f" >= {minimum}")
    if isinstance(number, bool) or not isinstance(number, numbers.Integral) or (minimum is not None and number < minimum):
        raise ValueError(f"{name} must be {allowed}, got {value!r}: give {name} as such a number, "
                         f"or leave it out for its default")
    return int(number)


def _real_number(name: str, value: Any) -> float:
    """A real-valued model arg from a number or its text; "abc" and True are refused.

    Range checks (finite, >= 0, ...) are StrategySettings' and name the allowed values.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}: give e.g. {name}=0.5, "
                         f"or leave {name} out for its default") from None


# ------------------------------------------------------------- run controls

DEFAULT_SEED = 1234  # lm-eval's default torch seed: a run without --seed samples as it always did


def sampling_seed(seed: int | str | None) -> tuple[int, str]:
    """The sampling seed and where it came from; the one place the run's seed is read.

    1. The model arg `seed`, when given: ``(seed, "model_args")``.
    2. Else the torch seed that lm-eval's `simple_evaluate` set from `--seed` (its third
       value, `torch_random_seed`, default 1234) just before it built this model:
       ``(seed, "lm-eval --seed")``. This is what `lm_eval --seed`,
       `python -m lm_eval`, `dvoting eval` and `simple_evaluate(model="dvoting-llada")` do.
    3. Else ``(1234, "default")``: a model built directly in Python, by `dvoting compare`, or
       by `simple_evaluate(torch_random_seed=None)` (`--seed 0,None,None,1234`). torch's
       initial seed is not used then: unseeded it is random per process, and a run with no
       seed must still repeat exactly.
    """
    if seed is not None:
        return _whole_number("seed", seed), "model_args"
    harness_seed = _lm_eval_torch_seed()
    if harness_seed is not None:
        return harness_seed, "lm-eval --seed"
    return DEFAULT_SEED, "default"


def _lm_eval_torch_seed() -> int | None:
    """The torch seed lm-eval's `simple_evaluate` set, when this model is built inside it.

    `simple_evaluate` seeds torch (`set_torch_seed(torch_random_seed)`) and then creates the
    model from its name, so while the model is built its frame is on the stack with the
    seed it used as the local `torch_random_seed` (None: torch was left unseeded). The
    value is read there rather than from `torch.initial_seed()`, which anything run in
    between (a task's own code) could have reseeded.
    """
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "simple_evaluate" and frame.f_globals.get("__name__") == "lm_eval.evaluator":
            seed = frame.f_locals.get("torch_random_seed")
            return None if seed is None else int(seed)
        frame = frame.f_back
    return None


# What lm-eval's CLI hands every model (`create_from_arg_*`'s additional config) when the
# flag is not on the command line, and the flag's spellings.
_CLI_DEFAULTS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "device": ("cuda:0", ("--device",)),
    "batch_size": (1, ("--batch_size", "-b")),
}


def _on_command_line(flags: tuple[str, ...]) -> bool:
    """Whether one of `flags` was typed on this process's command line (`--flag v`, `--flag=v`)."""
    for arg in sys.argv[1:]:
        for flag in flags:
            if arg == flag or arg.startswith(flag + "=") or (len(flag) == 2 and arg.startswith(flag)):
                return True
    return False


def merge_run_args(model_args: dict[str, Any], run_args: dict[str, Any]) -> dict[str, Any]:
    """Model args plus lm-eval's run-wide `device`/`batch_size`/`max_batch_size`, without clashes.

    lm-eval passes its `--device` (default `cuda:0`, even on a machine without a GPU) and
    `--batch_size` (default 1) to every model as keyword arguments beside the model args,
    so `--model_args device=cpu` used to end in "got multiple values for keyword argument".
    Here a value given in the model args wins over lm-eval's default; the same value in both
    places is fine; two different values that the user both typed are an error. lm-eval's
    default device (`cuda:0` with no `--device` on the command line) is dropped, so the model
    picks CUDA when there is one and the CPU otherwise, silently. In the Python API
    (`simple_evaluate(device="cuda:0")`) that value cannot be told from the CLI's default and
    is treated the same way.
    """
    merged = dict(model_args)
    for key, value in run_args.items():
        if value is None:
            continue
        default, flags = _CLI_DEFAULTS.get(key, (None, ()))
        is_default = flags != () and str(value) == str(default) and not _on_command_line(flags)
        if key not in merged:
            if not (key == "device" and is_default):
                merged[key] = value
        elif str(merged[key]) != str(value) and not is_default:
            raise ValueError(
                f"{key}={merged[key]!r} in --model_args conflicts with --{key} {value}: "
                f"give {key} in one place only"
            )
    return merged


# HFLM model args this plugin refuses, with what to do instead (a false/empty value is accepted)
_REFUSED_HFLM_ARGS = {
    "parallelize": "splitting one model across GPUs is not supported; run data parallel instead "
                   "(accelerate launch -m lm_eval ... or torchrun, one model per GPU; README "
                   "'Several processes / GPUs')",
    "peft": "adapters are not supported; merge the adapter into the base weights, save them as "
            "safetensors beside config.json and pass that folder as pretrained",
    "delta": "delta weights are not supported; add them to the base weights, save the result as "
             "safetensors beside config.json and pass that folder as pretrained",
}


def _refuse_unknown_args(unknown: dict[str, Any]) -> None:
    """Refused HFLM args get their own message; other unknown args the closest accepted name."""
    for name, reason in _REFUSED_HFLM_ARGS.items():
        value = unknown.pop(name, None)
        if value not in (None, "", False, "false", "False", "none", "None", 0):
            raise ValueError(f"model arg {name}={value!r}: {reason}")
    if not unknown:
        return
    accepted = [p for p in inspect.signature(DVotingEvalModel.__init__).parameters
                if p not in ("self", "unknown")]
    hints = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, accepted, n=1)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    raise ValueError(f"unknown model args {', '.join(hints)}; accepted model args are: {', '.join(accepted)}")


def _hflm_args(trust_remote_code: bool | str, use_fast_tokenizer: bool | str, add_bos_token: bool | str) -> dict[str, bool]:
    """HFLM's tokenizer/loading flags, checked before any model work."""
    if _flag("trust_remote_code", trust_remote_code):
        # `--trust_remote_code` adds this model arg; accepted so LLaDA/Dream recipes run as
        # they are, but there is nothing to trust: the architectures are this package's code
        log.warning("trust_remote_code=True has no effect: dvoting models are built by this plugin's own "
                    "code from the checkpoint's config and weights; no downloaded code is ever run")
    if not _flag("use_fast_tokenizer", use_fast_tokenizer):
        raise ValueError(
            "use_fast_tokenizer=False: transformers 5 loads only fast (Rust) tokenizers, so a slow one "
            "cannot be chosen; drop use_fast_tokenizer (the fast tokenizer reads the same files)"
        )
    return {"add_bos_token": _flag("add_bos_token", add_bos_token)}


def _bos_setting(add_bos: bool, tokenizer: Any, source: Any) -> bool:
    """`add_bos_token=true` needs a tokenizer with a BOS token (LLaDA has one, Dream does not)."""
    if add_bos and tokenizer.bos_token_id is None:
        raise ValueError(
            f"add_bos_token=True, but the tokenizer of {source} has no BOS token: drop add_bos_token "
            "(prompts are encoded without special tokens; a chat template adds its own)"
        )
    return add_bos


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


def sanitise_requests(requests: list[Any]) -> None:
    """Lone surrogates in a request's text become U+FFFD in the request itself, before any model work.

    lm-eval 0.4.13 hashes each request's context for `--log_samples` (`prompt_hash`,
    utf-8 without error handling) and writes it to the samples file only after every
    request has been answered, so text no encoder accepts (a prompt function or template
    that emits a lone surrogate) would lose the whole run there. Rewritten here, the
    request is scored, hashed, cached and logged as the text the model really saw.
    """
    rewritten = []
    for req in requests:
        args = req.args
        clean = tuple(_encodable(a) if isinstance(a, str) else a for a in args)
        if clean != args:
            arguments = getattr(req, "arguments", None)
            if arguments is None:  # a stand-in for lm-eval's Instance with a plain `args`
                req.args = clean
            else:  # Instance: `args` is a read-only view of `arguments`
                req.arguments = clean if isinstance(arguments, tuple) else clean[0]
            rewritten.append(f"task {req.task_name}, document {req.doc_id}")
    if rewritten:  # one warning per call, not one per document: a broken template hits them all
        shown = "; ".join(rewritten[:5]) + ("; ..." if len(rewritten) > 5 else "")
        log.warning("%d request(s) hold lone surrogates (invalid unicode), replaced by U+FFFD before the "
                    "model runs: %s", len(rewritten), shown)


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

