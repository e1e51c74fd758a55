"""The lm-eval LM classes `dvoting-llada`, `dvoting-dream`, `dvoting-llada2`, `dvoting-llada21`.

The lm-eval adapter: it subclasses lm-eval's `TemplateLM`, parses model args, tokenizes
(with the chat template when `--apply_chat_template` is given), hands token ids to a
strategy (strategies.py), and returns each voted text as a `CostedText` carrying the
request's cost and settings (`nfe`, `n_samples`, `votes`, `trace`, `settings`).
Importing it installs the plugin's patches to lm-eval (task_costs.py: every task reports its
cost per question; length_checks.py: task lengths checked before any model work;
strict_json.py: standard JSON files), each through lm_eval_seam.py, the one module that
knows which lm-eval internals the plugin touches. Registration with lm-eval is done by the
plugin hook (plugin.py), by "module:Class" string. What each request asks for (settings,
stop strings, answer kind, prompt ids, seed) is planned by request_planning.py; requests are
cleaned and numbered by requests.py (shared with result_cache.py, which binds `--use_cache`
to the run's settings); what the requests cost and which settings they ran with is kept by
bookkeeping.py.

Choices a user of the harness should know (also in the README):
* `--batch_size N` is the number of *rows* decoded per forward pass; a row is one
  sample of one question, so a dVoting batch holds up to N samples of several
  questions. "auto" means 32 rows on a GPU and 8 on a CPU.
* `max_gen_toks` is the generation length L: the task's (its YAML or `--gen_kwargs`), else
  the model arg's (default 256). LLaDA's and Dream's block length defaults to L/16 and must
  divide L; LLaDA2 decodes in blocks of 32 aligned to the prompt's start, any L. Each
  task's L is checked against the block rule and the model's maximum length before the
  weights are read when `simple_evaluate` (or the `lm_eval` CLI) is given our model's name
  and the checkpoint's config.json is on this machine (`check_lengths_before_loading`,
  length_checks.py); else when lm-eval's `evaluate` starts, before any request is built
  or decoded; and again per request.
* The strategy owns the sampling temperature. A task's `do_sample`/`temperature`
  apply to `strategy=single` only (so the harness's self-consistency tasks work as
  a majority-voting baseline); a value the strategy does not use gets one warning per
  run (`request_planning.task_sampling`).
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
* `parallelize=True` (HFLM's, with `max_memory_per_gpu`/`max_cpu_memory`) spreads one model
  over this process's GPUs by layers (models/placement.py); the args are checked, and the
  GPUs' budget read, before any model work (`_parallel_budget`).
* Characters the tokenizer does not know become its unknown token. Lone surrogates
  (invalid unicode, from a prompt template or function) become U+FFFD in the request
  itself before any model work (`sanitise_requests`, one warning per call), so
  lm-eval's `--log_samples` hashing and logging, which run after all generation and
  would fail on them, see the text the model saw.
* A strategy setting given a value (other than its default) that the strategy, its commit
  rule and its vote do not read (`guidance` without rfg, `block_length` with hex, `threshold`
  with the fixed schedule, ...; each part's `reads` in core/parts/) is accepted with one warning per
  run and left out of `settings_used` and of the result cache's fingerprint, since it
  changes no output; `config.dvoting.settings` keeps every model arg as given.
* Model args are validated before the checkpoint is read: the strategy settings' are read by
  the parser their declaration names (core/settings.py; `arg_parsing.parse_settings`: whole
  numbers 5, "5", 5.0, not 2.5, "abc", True), ranges and combinations by `StrategySettings`.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from lm_eval.api.model import TemplateLM
from tqdm import tqdm

from lm_eval_dvoting.core.answers import answers_equivalent, extract_answer
from lm_eval_dvoting.core.decoding.static_steps import (
    CAPTURED,
    check_cached_steps,
    resolve_cached_steps,
)
from lm_eval_dvoting.core.guidance import GuidedModel
from lm_eval_dvoting.core.likelihood import rolling_loglikelihood, score_requests
from lm_eval_dvoting.core.parts import default_cache
from lm_eval_dvoting.core.strategies import (
    StrategySettings,
    decode_questions,
    derive_seed,
    report_unused_settings,
)
from lm_eval_dvoting.integration.arg_parsing import (
    flag,
    parse_settings,
    setting_arg_default,
    setting_args,
    whole_number,
)
from lm_eval_dvoting.integration.bookkeeping import CostBook, costed_text, settings_entry
from lm_eval_dvoting.integration.costs import CostedText
from lm_eval_dvoting.integration.length_checks import install as _install_length_checks
from lm_eval_dvoting.integration.lm_eval_seam import (
    is_untyped_cli_default,
    simple_evaluate_torch_seed,
)
from lm_eval_dvoting.integration.request_planning import RequestPlanner, generated_text, task_length
from lm_eval_dvoting.integration.requests import (
    encodable,
    generation_key_args,
    repeat_indices,
    sanitise_requests,
)
from lm_eval_dvoting.integration.result_cache import bind as bind_result_cache
from lm_eval_dvoting.integration.strict_json import install as _install_strict_json
from lm_eval_dvoting.integration.task_costs import RunCosts
from lm_eval_dvoting.integration.task_costs import install as _install_task_costs
from lm_eval_dvoting.models.adapters import attach as attach_adapter
from lm_eval_dvoting.models.adapters import read_adapter
from lm_eval_dvoting.models.families import FAMILIES, MODEL_NAMES, ModelName, other_model_for
from lm_eval_dvoting.models.loading import (
    checkpoint_facts,
    config_max_length,
    hub_revision,
    load_model,
    load_tokenizer,
    local_checkpoint,
    model_family,
    read_config,
    resolve_checkpoint,
    resolve_device,
)
from lm_eval_dvoting.models.placement import describe as describe_placement
from lm_eval_dvoting.models.placement import gpu_budget

log = logging.getLogger(__name__)
# every task a dvoting model runs reports its cost per question (mean NFE, samples)
_install_task_costs()
# every generation task's length is checked when lm-eval's evaluate starts
_install_length_checks()
# a dvoting run's results and samples files hold standard JSON (no NaN/Infinity)
_install_strict_json()

AUTO_BATCH_ROWS = {"cuda": 32, "cpu": 8}


class DVotingEvalModel(TemplateLM):
    """A diffusion LM evaluated with a voting strategy (single, majority, hex, dvoting,
    temporal, rfg).

    This class is the lm-eval interface; request planning (settings, seeds, prompts and
    answer kind per request) is `request_planning.py`'s, result bookkeeping (cost totals,
    settings used) `bookkeeping.py`'s.
    """

    default_pretrained = ""
    # what the generation progress bar names besides "dVoting generate_until" (e.g. `dvoting
    # compare`'s row and seed); None: nothing
    progress_label: str | None = None

    def __init__(self, pretrained: str | None = None, **model_args: Any) -> None:
        """The model args (`accepted_model_args`: the harness's own and every strategy
        setting's, `core/settings.py`), each checked before any model work."""
        super().__init__()
        args = _model_args(dict(model_args, pretrained=pretrained))
        hf_args = _hflm_args(
            args["trust_remote_code"], args["use_fast_tokenizer"], args["add_bos_token"]
        )
        # parallelize=True: the GPUs' memory budget (None: one device), before any model work
        self._max_memory = _parallel_budget(*(args[name] for name in _PARALLEL_ARGS))
        self.settings = self.settings_from_args(args)
        self._unused_reported: set[str] = set()  # given settings reported as unused, once per run
        report_unused_settings(self.settings, self._unused_reported, log)
        self.pretrained = args["pretrained"] or self.default_pretrained
        # the sampling seed and where it came from ("model_args", "lm-eval --seed", "default")
        self.seed, self.seed_source = sampling_seed(args["seed"])
        # what `use_strategy` starts from, so one switch's overrides never leak into the next
        self._built_settings, self._built_seed = self.settings, (self.seed, self.seed_source)
        self.mc_num = whole_number("mc_num", args["mc_num"], 1)
        max_length = args["max_length"]
        max_length = None if max_length is None else whole_number("max_length", max_length, 1)
        self._setup_processes(args["device"])
        # parsed before the checkpoint is read: a bad batch size fails at once
        self.batch_rows = self._parse_batch_size(args["batch_size"], args["max_batch_size"])
        cached_steps = _checked_cached_steps(args["cached_steps"], self._device)
        loading = ("tokenizer", "revision", "subfolder", "dtype")
        self._load_checkpoint(
            *(args[name] for name in loading),
            hf_args["add_bos_token"],
            args["peft"],
            args["reference"],
        )
        self.max_length = self._checked_max_length(max_length)
        self._set_cached_steps(cached_steps)
        # task sampling values reported as unused
        self._ignored_sampling: set[tuple[Any, ...]] = set()
        self.costs = CostBook()  # cost totals and settings used of the requests computed

    # ---------------------------------------------------------------- set-up

    # The `--model` name's record (models/families.py; the classes at the bottom of this
    # module are built from them): the family it is named for, and `block_decoding`: None for
    # bidirectional decoding, else block diffusion's default (strategies.BLOCK_DECODINGS).
    # None: a bare DVotingEvalModel, which decodes any checkpoint unchecked.
    spec: ModelName | None = None
    family = ""
    block_decoding: str | None = None

    @classmethod
    def _block_decoding(cls, editing: str | None) -> str | None:
        """The block-diffusion rule of this model name, with LLaDA2.1's `editing` preset."""
        if editing is None:
            return cls.block_decoding
        if cls.spec is None or not cls.spec.editing:
            raise ValueError(
                f"editing={editing!r} is LLaDA2.1's (joint threshold decoding): use --model "
                "dvoting-llada21, or leave editing out"
            )
        if editing not in ("quality", "speed"):
            raise ValueError(
                f"editing must be quality or speed (LLaDA2.1's model card presets), got {editing!r}"
            )
        return editing

    def _check_family(self, folder: Any) -> None:
        """Refuse, before any weights are read, a checkpoint that this model name would decode
        with another family's semantics; name the model that decodes it."""
        family = FAMILIES[model_family(read_config(folder), folder / "config.json")]
        right = other_model_for(self.spec, family, str(self.pretrained))
        if right is not None:
            raise ValueError(
                f"pretrained={self.pretrained} is a {family.display} checkpoint, which "
                f"--model {self.model_name} does not decode: use --model {right}"
            )

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
                # each rank runs where accelerate puts it; a device asked for elsewhere is not
                # honoured
                raise ValueError(
                    f"device {device!r} was asked for, but under torchrun/accelerate each rank "
                    f"runs on the device accelerate gives it ({self._device}): drop "
                    "--device/device=, or for the CPU set ACCELERATE_USE_CPU=1"
                )
        else:
            self._device = resolve_device(device)
            self._rank, self._world_size = 0, 1

    def _parse_batch_size(self, batch_size: int | str, max_batch_size: int | None) -> int:
        if str(batch_size).startswith("auto"):
            rows = AUTO_BATCH_ROWS["cuda" if self._device.type == "cuda" else "cpu"]
            # 0 is refused, not read as "no cap"
            return (
                rows
                if max_batch_size is None
                else min(rows, whole_number("max_batch_size", max_batch_size, 1))
            )
        try:
            return whole_number("batch_size", batch_size, 1)
        except ValueError:
            raise ValueError(
                f"batch_size must be a positive integer or 'auto', got {batch_size!r}"
            ) from None

    def _load_checkpoint(
        self,
        tokenizer: str | None,
        revision: str | None,
        subfolder: str | None,
        dtype: str | None,
        add_bos_token: bool,
        peft: str | None = None,
        reference: str | None = None,
    ) -> None:
        """The tokenizer and the weights of `self.pretrained` (hub id, folder or packaged name),
        with the LoRA adapter `peft` (hub id or folder; models/adapters.py) on it, unmerged."""
        # the adapter's files and the reference's folder first: bad ones are refused before
        # any weights are read
        reference_folder = self._read_adapter_and_reference(peft, reference)
        # one resolution of the checkpoint, so config, weights and tokenizer come from the
        # same snapshot (a hub branch that moves between two look-ups cannot mix them)
        folder = resolve_checkpoint(self.pretrained, revision=revision, subfolder=subfolder)
        if self.spec is not None:
            self._check_family(folder)
        self.revision = hub_revision(folder)  # the hub commit loaded; None for a local folder
        self.subfolder = subfolder or None
        # the tokenizer first: it is cheap, and add_bos_token is checked against it
        self.tokenizer = load_tokenizer(tokenizer or folder)
        self._tokenizer_source = tokenizer or self.pretrained
        self.add_bos_token = _bos_setting(
            add_bos_token, self.tokenizer, tokenizer or self.pretrained
        )
        if reference_folder is not None:
            _check_reference(folder, self.tokenizer, reference_folder, reference)
        self._load_weights(folder, dtype)
        self._load_reference(reference_folder, dtype)
        if self.model.family != self.family:
            log.warning(
                "checkpoint %s is a %s model, loaded by dvoting-%s",
                self.pretrained,
                self.model.family,
                self.family,
            )

    def _set_cached_steps(self, asked: str) -> None:
        """The models' `cached_steps` (`core/decoding/static_steps.py`), as the decoder reads
        it; `graphs` or `compiled` where it cannot apply (e.g. a model spread over GPUs) is
        refused here, after loading and before any decoding."""
        for model in (self.model, self.reference_model):
            if model is not None:
                resolve_cached_steps(asked, model, self._device)
                model.cached_steps = asked

    @property
    def cached_steps(self) -> str:
        """The mode the policy's cached steps run in now (`auto` resolved; `static` once a
        CUDA-graph capture failed under `auto`, which sets the model's to `static`)."""
        return resolve_cached_steps(self.model.cached_steps, self.model, self._device)

    def _read_adapter_and_reference(self, peft: str | None, reference: str | None) -> Any:
        """Read the adapter `peft` and find the folder of the RFG `reference` (None: none),
        refusing strategy=rfg with neither."""
        self.adapter = None if peft is None else read_adapter(peft)
        self.reference = reference
        reference_folder = None if reference is None else resolve_checkpoint(reference)
        if self.settings.strategy == "rfg" and reference is None and self.adapter is None:
            raise ValueError(
                "strategy=rfg needs a reference: give reference=<hub id | folder> (a second model "
                "of the policy's family) or peft=<adapter> (the reference is then the base model "
                "with the adapter switched off)"
            )
        return reference_folder

    def _load_weights(self, folder: Any, dtype: str | None) -> None:
        """`self.model` from `folder`, on this process's device or, with parallelize=True,
        spread over the GPUs; the adapter attached."""
        max_memory = getattr(self, "_max_memory", None)
        if max_memory is None:
            self.model = load_model(folder, device=self._device, dtype=dtype)
        else:  # parallelize=True: spread over the GPUs; token ids go to the embedding's GPU
            self.model = load_model(folder, dtype=dtype, device_map="auto", max_memory=max_memory)
            self._device = self.model.main_device
            log.info("parallelize=True: %s", describe_placement(self.model.device_map))
        if self.adapter is not None:
            # Unmerged: the base model stays as it was read (the reference of RFG is the base
            # with the adapter switched off), and no weight is rounded twice by merging and
            # unmerging; the LoRA products cost r * (in + out) per token and layer.
            attach_adapter(self.model, self.adapter)

    def _load_reference(self, reference_folder: Any, dtype: str | None) -> None:
        """`self.reference_model`, RFG's reference read from `reference_folder` (None: none)."""
        self.reference_model = None
        if reference_folder is not None:
            self.reference_model = load_model(reference_folder, device=self._device, dtype=dtype)
            # refuses a pair with other mask or end ids
            GuidedModel(self.model, self.reference_model)

    def _checked_max_length(self, max_length: int | None) -> int:
        """The model arg `max_length` (prompt plus generation), else the model's own maximum
        (with an RFG reference, the shorter of the two models')."""
        if self.reference_model is not None:
            self.model.max_length = min(self.model.max_length, self.reference_model.max_length)
        return checked_max_length(max_length, self.model.max_length)

    @classmethod
    def settings_from_args(cls, args: dict[str, Any]) -> StrategySettings:
        """The strategy settings of these model args (those not in `args`: their declared
        defaults), each value read by its declared parser (`arg_parsing.parse_settings`) and
        checked; the constructor's own and, before any model is built,
        `check_lengths_before_loading`'s. The generation length (`max_gen_toks`, the default
        of tasks that give none) is checked against the block rules only with each task's
        length (`request_planning.task_length`), as a task's `max_gen_toks` replaces it.
        `cache` left out is the model kind's (`parts.default_cache`)."""
        block_decoding = cls._block_decoding(args.get("editing"))
        value = parse_settings(args)
        if value["cache"] is None:
            value["cache"] = default_cache(
                value["strategy"], value["vote"], block_decoding is not None
            )
        return StrategySettings(**value, block_decoding=block_decoding, defer_length_checks=True)

    @classmethod
    def max_length_before_loading(cls, args: dict[str, Any]) -> tuple[int, str] | None:
        """The length (prompt plus generation) a model of these constructor args will plan
        with, and where it comes from, from the checkpoints' config.json alone; None when a
        config is not on this machine (`local_checkpoint`: no download) or cannot be read
        (the constructor then says why, in its own order). Refuses a model arg `max_length`
        over the model's maximum, as the constructor would once the weights are read."""
        try:
            folder = local_checkpoint(
                args.get("pretrained") or cls.default_pretrained,
                args.get("revision"),
                args.get("subfolder"),
            )
            model_max = None if folder is None else config_max_length(folder)
            reference = args.get("reference")
            if model_max is not None and reference is not None:  # rfg: the shorter model's
                reference_folder = local_checkpoint(reference)
                if reference_folder is not None:
                    model_max = min(model_max, config_max_length(reference_folder))
            asked = args.get("max_length")
            asked = None if asked is None else whole_number("max_length", asked, 1)
        except Exception:
            return None
        if model_max is None:
            return None
        length = checked_max_length(asked, model_max)
        return length, max_length_source(length, model_max)

    @classmethod
    def check_lengths_before_loading(
        cls,
        args: dict[str, Any],
        max_length: tuple[int, str],
        generation_kwargs: dict[str, dict[str, Any] | None],
    ) -> None:
        """`check_task_lengths` before the model is built: each generation task's length
        (its generation kwargs as its requests will carry them) against these constructor
        args' settings and `max_length` (`max_length_before_loading`'s), with the same
        messages. Args the constructor refuses are left to it."""
        try:
            settings = cls.settings_from_args(args)
        except Exception:
            return
        for task_name, kwargs in generation_kwargs.items():
            task_length(settings, dict(kwargs or {}), task_name, *max_length)

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
    ) -> DVotingEvalModel:
        """What lm-eval calls with the model args and its run-wide `device`/`batch_size`
        (`merge_run_args`).

        lm-eval's parser of a model-args text (`simple_evaluate(model_args="...")`; its CLI keeps
        the string) reads the value `none` as None, which for every other arg means "the default";
        but `cache=none` names a policy, the exact one, which for LLaDA2 is not the default
        (`block`). A `cache` given as None is therefore that policy."""
        return cls(**cls.constructor_args(arg_dict, additional_config))

    @classmethod
    def constructor_args(
        cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The keyword args `create_from_arg_obj` builds the model with (see there)."""
        args = dict(arg_dict)
        if "cache" in args and args["cache"] is None:
            args["cache"] = "none"
        return merge_run_args(args, additional_config or {})

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: dict[str, Any] | None = None
    ) -> DVotingEvalModel:
        """As `create_from_arg_obj`, from lm-eval's `key=value,...` model args text."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    def use_strategy(self, strategy: str, seed: int | None = None, **overrides: Any) -> None:
        """Switch strategy on the loaded model (e.g. to compare them) and reset the totals.

        `overrides` replace other settings too (e.g. `decoder="entropy"`, `temperature=0.6`;
        checked as at construction); `seed`, when given, becomes the sampling seed of the
        evaluations that follow (`dvoting compare --seeds K`). Both apply to the settings and
        seed the model was built with, not to an earlier switch's: `use_strategy("majority")`
        after `use_strategy("majority", decoder="entropy")` is plain majority again. A given
        setting the new strategy does not read is reported once per model (as at construction)."""
        # the length checks wait for each request's length, as at construction
        settings = replace(
            self._built_settings, strategy=strategy, defer_length_checks=True, **overrides
        )
        if settings.strategy == "rfg" and self.reference_model is None and self.adapter is None:
            raise ValueError(
                "strategy=rfg needs a reference: load the model with reference=<hub id | folder> "
                "or peft=<adapter>"
            )
        self.settings = settings
        report_unused_settings(settings, self._unused_reported, log)
        self.seed, self.seed_source = self._built_seed
        if seed is not None:
            self.seed = whole_number("seed", seed)
            self.seed_source = "use_strategy"
        self.costs = CostBook()
        self._ignored_sampling = set()

    def begin_cost_run(self) -> RunCosts:
        """A fresh cost ledger for the evaluation starting now (called by lm-eval's `evaluate`,
        as patched by task_costs.py); `get_model_info` reports it afterwards."""
        return self.costs.begin_run()

    # The cost counters live in `self.costs`; the model still shows them under the names
    # callers (and tests) have always read and set.
    @property
    def totals(self) -> Counter[str]:
        """Cost (`requests`, `nfe`, `samples`) of the requests computed since the model was
        made or its strategy switched (on rank 0, every rank's once gathered)."""
        return self.costs.totals

    @totals.setter
    def totals(self, value: Counter[str]) -> None:
        self.costs.totals = value

    @property
    def _unshared(self) -> Counter[str]:
        return self.costs.unshared  # this rank's part of the totals not yet sent to rank 0

    @_unshared.setter
    def _unshared(self, value: Counter[str]) -> None:
        self.costs.unshared = value

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
        unsent_totals, unsent_run = self.costs.unsent()
        dist.gather_object((obj, unsent_totals, unsent_run), gathered, dst=dst)
        self.costs.mark_sent()
        if gathered is None:
            return None
        for rank, (_, totals, part) in enumerate(gathered):
            if rank != self.rank:
                self.costs.merge(totals, part)
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

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        ids = self.tokenizer.encode(encodable(string), add_special_tokens=bool(add_special_tokens))
        # add_bos_token (HFLM's model arg) applies when the caller does not decide, and never
        # doubles a BOS that the text (e.g. a chat template) already starts with
        bos = self.tokenizer.bos_token_id
        if add_special_tokens is None and self.add_bos_token and ids[:1] != [bos]:
            ids = [bos, *ids]
        return ids

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    # ------------------------------------------------------------ generation

    def _planner(self) -> RequestPlanner:
        """Request planning with the current settings and seed (`use_strategy` changes them)."""
        source = max_length_source(self.max_length, self.model.max_length)
        return RequestPlanner(
            settings=self.settings,
            seed=self.seed,
            encode=self.tok_encode,
            eot_token_id=self.eot_token_id,
            max_length=self.max_length,
            reported=self._ignored_sampling,
            on_settings=self.costs.note_settings,
            max_length_source=source,
        )

    def check_task_lengths(self, generation_kwargs: dict[str, dict[str, Any] | None]) -> None:
        """Refuse a generation task whose length these settings cannot decode or the model
        cannot hold (`RequestPlanner.length_settings`), given each task's generation kwargs
        as its requests will carry them; lm-eval's `evaluate` calls it before it builds any
        request (length_checks.py)."""
        planner = self._planner()
        for task_name, kwargs in generation_kwargs.items():
            planner.length_settings(kwargs, task_name)

    def _prompt_ids(self, context: str, gen_length: int) -> torch.Tensor:
        """The prompt a request with `context` and `gen_length` is decoded from
        (`RequestPlanner.prompt_ids`)."""
        return self._planner().prompt_ids(context, gen_length)

    def _decoding_model(self) -> torch.nn.Module:
        """The model the decoder runs: for strategy=rfg the policy guided by the reference
        (`reference=`'s model, else the policy with its adapter off; guidance.py)."""
        if self.settings.strategy != "rfg":
            return self.model
        # a reference or an adapter is there: construction and `use_strategy` refuse rfg without one
        return GuidedModel(
            self.model, self.reference_model
        )  # at the settings' guidance (strategies._model_for)

    def generated_text(self, tokens: torch.Tensor, until: list[str]) -> str:
        """Decoded text up to the first end token, then cut at the first `until` string."""
        return generated_text(self.tokenizer, self.model.end_token_ids, tokens, until)

    def _answer_of(
        self, until: list[str], kind: str, n_options: int | None = None
    ) -> Callable[[torch.Tensor], Any]:
        """A sample's `(kind, answer)` (None: no answer), from its text as the task's filters
        see it: a choice letter beyond the question's `n_options` is no answer, as scored."""

        def extract(tokens: torch.Tensor) -> Any:
            answer = extract_answer(self.generated_text(tokens, until), kind, n_options)
            return None if answer is None else (kind, answer)

        return extract

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """The voted text of each request (a `CostedText`), each (request, repeat) decoded once."""
        sanitise_requests(requests)
        plan = self._planner().plan(requests, repeat_indices(requests))
        texts: list[str | None] = [None] * len(requests)
        label = f" [{self.progress_label}]" if self.progress_label else ""
        desc = "dVoting generate_until" + label
        bar = tqdm(total=len(plan.jobs), desc=desc, disable=disable_tqdm or self.rank != 0)

        def done(index: int, result: Any) -> None:
            job = plan.jobs[index]
            text = self.generated_text(result.returned_tokens, job.until)
            texts[job.position] = self._costed(text, result, job.until, job.settings)
            # keyed on the repeat too: each repeat has its own seed (result_cache.py)
            self.cache_hook.add_partial(
                "generate_until",
                generation_key_args(requests[job.position], job.repeat),
                texts[job.position],
            )
            bar.update(1)

        decode_questions(
            self._decoding_model(),
            [job.prompt for job in plan.jobs],
            [job.settings for job in plan.jobs],
            [self._answer_of(job.until, job.kind, job.n_options) for job in plan.jobs],
            [job.seed for job in plan.jobs],
            same_answer=_same_answer,
            max_rows=self.batch_rows,
            on_done=done,
        )
        bar.close()
        for position, first in plan.copies.items():
            texts[position] = texts[first]
        return texts  # type: ignore[return-value]

    def _costed(
        self, text: str, result: Any, until: list[str], settings: StrategySettings
    ) -> CostedText:
        """The response for one computed request (`bookkeeping.costed_text`), counted in the
        totals."""
        candidates = [self.generated_text(sample, until) for sample in result.samples]
        response = costed_text(text, result, candidates, settings_entry(settings, self.seed))
        self.costs.count(result)
        return response

    # ------------------------------------------------------------ likelihood

    def _loglikelihood_tokens(
        self, requests: list[Any], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        self._refuse_block_likelihood()
        pairs = [
            (torch.tensor(ctx, dtype=torch.long), torch.tensor(cont, dtype=torch.long))
            for _, ctx, cont in requests
        ]
        seeds = [derive_seed(self.seed, "loglikelihood", ctx, cont) for _, ctx, cont in requests]
        bar = tqdm(
            total=len(requests),
            desc="dVoting loglikelihood",
            disable=disable_tqdm or self.rank != 0,
        )
        results = score_requests(
            self.model,
            pairs,
            mc_num=self.mc_num,
            batch_size=self.batch_rows,
            seeds=seeds,
            progress=bar.update,
        )
        bar.close()
        for (string_pair, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", string_pair, result)
        return results

    def _refuse_block_likelihood(self) -> None:
        if getattr(self.model, "block_causal", False):
            raise ValueError(
                f"--model {self.model_name} has no log-likelihood path: the Monte-Carlo estimate "
                "(likelihood.py) assumes a bidirectional mask predictor, and LLaDA2 is block "
                "diffusion; run generation tasks (generate_until) with it"
            )

    def loglikelihood(
        self, requests: list[Any], disable_tqdm: bool = False
    ) -> list[tuple[float, bool]]:
        self._refuse_block_likelihood()
        sanitise_requests(requests)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        self._refuse_block_likelihood()
        sanitise_requests(requests)
        scores = []
        for req in tqdm(
            requests, desc="dVoting loglikelihood_rolling", disable=disable_tqdm or self.rank != 0
        ):
            (text,) = req.args
            ids = torch.tensor(self.tok_encode(text), dtype=torch.long)
            score = rolling_loglikelihood(
                self.model,
                ids,
                mc_num=self.mc_num,
                seed=derive_seed(self.seed, "rolling", text),
                prefix_ids=torch.tensor([self.prefix_token_id]),
                batch_size=self.batch_rows,
            )
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
        ``settings_used`` holds only the settings their decode reads (`strategies.unused_settings`).
        """
        return {"dvoting": {**self._loaded_info(), **self.costs.report(self.settings, self.seed)}}

    def _loaded_info(self) -> dict[str, Any]:
        """What was loaded and how it runs (`get_model_info`'s part before the settings)."""
        return {
            "pretrained": self.pretrained,
            "family": self.model.family,
            # hub commit loaded (None: a local folder or packaged checkpoint)
            "revision": self.revision,
            "subfolder": self.subfolder,
            # RFG's reference model (None: none loaded; with peft=, the base is the reference)
            "reference": self.reference,
            # the LoRA adapter on the weights: its source and a digest of its files
            "peft": None
            if self.adapter is None
            else {"source": self.adapter.source, "digest": self.adapter.identity},
            "seed": self.seed,
            # "model_args" (the model arg seed), "lm-eval --seed" (the run's torch seed),
            # "default", or "use_strategy" (set by a switch, e.g. `dvoting compare --seeds`)
            "seed_source": self.seed_source,
            "mc_num": self.mc_num,
            "batch_rows": self.batch_rows,
            # outputs in bfloat16/float16 can depend on the batch (README, Reproducibility):
            # dtype, device and batch_rows are what a rerun must repeat
            "dtype": self.dtype_name,
            # a CPU rank is "cpu:0"
            "device": "cpu" if self._device.type == "cpu" else str(self._device),
            # parallelize=True: module -> GPU index ("cpu": offloaded) per layer; None: all on
            # `device`
            "device_map": getattr(self.model, "device_map", None),
            # how the cached steps ran: static buffers and CUDA graphs give dynamic's tokens;
            # compiled (fused kernels) rounds otherwise
            "cached_steps": self.cached_steps,
        }


def checked_max_length(max_length: int | None, model_max: int) -> int:
    """The model arg `max_length` (prompt plus generation), else the model's maximum
    `model_max`; a `max_length` over `model_max` is refused."""
    if max_length is not None and max_length > model_max:
        # longer prompts would be refused by the decoder mid-run, after other requests' work
        raise ValueError(
            f"max_length {max_length} exceeds the model's maximum length {model_max}: "
            f"give max_length <= {model_max}, or leave it out for the model's"
        )
    return int(max_length or model_max)


def max_length_source(max_length: int, model_max: int) -> str:
    """Where the length the requests are planned with comes from, for its messages."""
    return "the model's maximum length" if max_length == model_max else "the model arg max_length"


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
        return whole_number("seed", seed), "model_args"
    harness_seed = simple_evaluate_torch_seed()
    if harness_seed is not None:
        return harness_seed, "lm-eval --seed"
    return DEFAULT_SEED, "default"


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
        is_default = is_untyped_cli_default(key, value)
        if key not in merged:
            if not (key == "device" and is_default):
                merged[key] = value
        elif str(merged[key]) != str(value) and not is_default:
            raise ValueError(
                f"{key}={merged[key]!r} in --model_args conflicts with --{key} {value}: "
                f"give {key} in one place only"
            )
    return merged


def _check_reference(folder: Path, tokenizer: Any, reference_folder: Path, reference: str) -> None:
    """RFG's reference must read the policy's token ids: refused from the config files and
    tokenizers, before any weights are read."""
    mine, theirs = checkpoint_facts(folder), checkpoint_facts(reference_folder)
    differ = [f"{key} {mine[key]!r} vs {theirs[key]!r}" for key in mine if mine[key] != theirs[key]]
    if load_tokenizer(reference_folder).get_vocab() != tokenizer.get_vocab():
        differ.append("the tokenizers' vocabularies")
    if differ:
        raise ValueError(
            f"reference={reference!r} does not read the policy's token ids ({'; '.join(differ)}): "
            "RFG compares the two models' probabilities of the same tokens; give a reference of "
            "the policy's family and tokenizer"
        )


# HFLM model args this plugin refuses, with what to do instead (a false/empty value is accepted)
_REFUSED_HFLM_ARGS = {
    "offload_folder": "offloading to disk is not supported: with parallelize=True the model "
    "must fit the GPUs (max_memory_per_gpu) plus the CPU (max_cpu_memory); drop offload_folder",
    "delta": "delta weights are not supported; add them to the base weights, save the result as "
    "safetensors beside config.json and pass that folder as pretrained",
}


# The harness's own model args and their defaults (the strategy settings' are declared in
# core/settings.py and read by `arg_parsing.parse_settings`)
_OWN_ARGS: dict[str, Any] = {
    "pretrained": None,
    "tokenizer": None,
    "editing": None,  # LLaDA2.1's preset (`_block_decoding`)
    "peft": None,
    "reference": None,
    "seed": None,
    "dtype": None,
    "max_length": None,
    "mc_num": 128,
    "batch_size": 1,
    "max_batch_size": None,
    "device": None,
    # HFLM's habits (`--model hf`): honoured, or refused with their own message
    "revision": None,
    "subfolder": None,
    "trust_remote_code": False,
    "use_fast_tokenizer": True,
    "add_bos_token": False,
    "parallelize": False,
    "max_memory_per_gpu": None,
    "max_cpu_memory": None,
    "device_map": None,
    # how the reuse passes of cache=prefix|dual (and, captured, cache=none's full passes)
    # run: auto, dynamic, static, graphs or compiled (static_steps.py)
    "cached_steps": "auto",
}
# the order the accepted model args are listed in (a setting not named here comes last)
_ARG_ORDER = (
    "pretrained tokenizer strategy n alpha temperature tau block_length steps remasking "
    "hex_samples prefix_cache decoder cache threshold temporal_weight temporal_alpha editing "
    "editing_threshold max_post_steps vote peft reference guidance seed dtype max_gen_toks "
    "max_length mc_num batch_size max_batch_size device cached_steps revision subfolder "
    "trust_remote_code use_fast_tokenizer add_bos_token parallelize max_memory_per_gpu "
    "max_cpu_memory device_map"
).split()
_PARALLEL_ARGS = (
    "parallelize",
    "max_memory_per_gpu",
    "max_cpu_memory",
    "device_map",
    "device",
    "reference",
    "peft",
)


def accepted_model_args() -> dict[str, Any]:
    """Every model arg and its default: the harness's own and the strategy settings'."""
    defaults = dict(_OWN_ARGS)
    for name, declared in setting_args().items():
        defaults[name] = setting_arg_default(declared)
    known = [name for name in _ARG_ORDER if name in defaults]
    return {name: defaults[name] for name in known + sorted(set(defaults) - set(known))}


def _model_args(given: dict[str, Any]) -> dict[str, Any]:
    """`given` with every accepted model arg's default filled in; unknown ones refused."""
    accepted = accepted_model_args()
    _refuse_unknown_args({name: v for name, v in given.items() if name not in accepted})
    return {name: given.get(name, default) for name, default in accepted.items()}


def _constructor_signature() -> inspect.Signature:
    """`DVotingEvalModel.__init__` as introspection shows it: one parameter per model arg."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params.append(
        inspect.Parameter("pretrained", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
    )
    params += [
        inspect.Parameter(name, keyword, default=default)
        for name, default in accepted_model_args().items()
        if name != "pretrained"
    ]
    return inspect.Signature(params)


DVotingEvalModel.__init__.__signature__ = _constructor_signature()  # type: ignore[attr-defined]


def _checked_cached_steps(asked: Any, device: torch.device) -> str:
    """The model arg `cached_steps`, checked before the checkpoint is read: one of
    `static_steps.CACHED_STEPS`, and `graphs` or `compiled` only on a CUDA device."""
    check_cached_steps(asked)
    if asked in CAPTURED and device.type != "cuda":
        raise ValueError(
            f"cached_steps={asked} needs a CUDA device, got device={device}: leave "
            "cached_steps out (auto) or give device=cuda"
        )
    return str(asked)


def _refuse_unknown_args(unknown: dict[str, Any]) -> None:
    """Refused HFLM args get their own message; other unknown args the closest accepted name."""
    for name, reason in _REFUSED_HFLM_ARGS.items():
        value = unknown.pop(name, None)
        if value not in (None, "", False, "false", "False", "none", "None", 0):
            raise ValueError(f"model arg {name}={value!r}: {reason}")
    if not unknown:
        return
    accepted = list(accepted_model_args())
    hints = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, accepted, n=1)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    raise ValueError(
        f"unknown model args {', '.join(hints)}; accepted model args are: {', '.join(accepted)}"
    )


def _parallel_budget(
    parallelize: bool | str,
    max_memory_per_gpu: Any,
    max_cpu_memory: Any,
    device_map: Any,
    device: str | None,
    reference: str | None,
    peft: str | None,
) -> dict[Any, int] | None:
    """HFLM's model-parallel args, checked before any model work: the memory budget of
    `device_map="auto"` over this process's GPUs (`placement.gpu_budget`, as HFLM builds it),
    or None without `parallelize` (one device)."""
    if not flag("parallelize", parallelize):
        _refuse_placement_args(
            max_memory_per_gpu=max_memory_per_gpu,
            max_cpu_memory=max_cpu_memory,
            device_map=device_map,
        )
        return None
    if device_map not in (None, "auto"):
        raise ValueError(
            f"device_map={device_map!r}: parallelize=True places the model with device_map='auto' "
            "(balanced over the GPUs, as lm-eval's hf model does), the only map supported here: "
            "drop device_map (in Python, load_model(device_map=...) also takes a dict)"
        )
    if device is not None and torch.device(device).type != "cuda":
        raise ValueError(
            f"device={device!r} with parallelize=True, which spreads the model over the GPUs: drop "
            f"device (--device), or drop parallelize to run on {device}"
        )
    _refuse_second_models(reference, peft, max_cpu_memory)
    return gpu_budget(max_memory_per_gpu, max_cpu_memory)


def _refuse_second_models(reference: str | None, peft: str | None, max_cpu_memory: Any) -> None:
    """With parallelize: no RFG reference model, and no adapter on offloaded layers."""
    if reference is not None:
        raise ValueError(
            f"reference={reference!r} with parallelize=True: RFG's second model is not spread over "
            "the GPUs; give strategy=rfg a LoRA adapter instead (peft=..., one model), or drop "
            "parallelize"
        )
    if peft is not None and max_cpu_memory is not None:
        raise ValueError(
            f"peft={peft!r} with max_cpu_memory={max_cpu_memory!r}: a LoRA adapter cannot sit on "
            "layers offloaded to the CPU; drop max_cpu_memory (the model must then fit the GPUs) "
            "or peft"
        )


def _refuse_placement_args(**given: Any) -> None:
    """Without parallelize, the first placement arg given is refused (they place one model
    over the GPUs)."""
    for name, value in given.items():
        if value is not None:
            raise ValueError(
                f"{name}={value!r} applies with parallelize=True only (one model spread over the "
                f"GPUs): add parallelize=True, or drop {name}"
            )


def _hflm_args(
    trust_remote_code: bool | str, use_fast_tokenizer: bool | str, add_bos_token: bool | str
) -> dict[str, bool]:
    """HFLM's tokenizer/loading flags, checked before any model work."""
    if flag("trust_remote_code", trust_remote_code):
        # `--trust_remote_code` adds this model arg; accepted so LLaDA/Dream recipes run as
        # they are, but there is nothing to trust: the architectures are this package's code
        log.warning(
            "trust_remote_code=True has no effect: dvoting models are built by this plugin's own "
            "code from the checkpoint's config and weights; no downloaded code is ever run"
        )
    if not flag("use_fast_tokenizer", use_fast_tokenizer):
        raise ValueError(
            "use_fast_tokenizer=False: transformers 5 loads only fast (Rust) tokenizers, so a "
            "slow one cannot be chosen; drop use_fast_tokenizer (the fast tokenizer reads the "
            "same files)"
        )
    return {"add_bos_token": flag("add_bos_token", add_bos_token)}


def _bos_setting(add_bos: bool, tokenizer: Any, source: Any) -> bool:
    """`add_bos_token=true` needs a tokenizer with a BOS token (LLaDA has one, Dream does not)."""
    if add_bos and tokenizer.bos_token_id is None:
        raise ValueError(
            f"add_bos_token=True, but the tokenizer of {source} has no BOS token: drop "
            "add_bos_token (prompts are encoded without special tokens; a chat template adds its "
            "own)"
        )
    return add_bos


def _same_answer(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Answers carry their kind: math answers group by equivalence, others by equality."""
    return a[0] == b[0] and answers_equivalent(a[1], b[1], a[0])


def _eval_model_class(spec: ModelName) -> type[DVotingEvalModel]:
    """The lm-eval class of a `--model` name, built from its record (models/families.py)."""
    attributes = {
        "__doc__": spec.doc,
        "__module__": __name__,
        "__qualname__": spec.class_name,
        "spec": spec,
        "family": spec.family,
        "model_name": spec.name,
        "block_decoding": spec.block_decoding,
        "default_pretrained": spec.default_pretrained,
    }
    return type(spec.class_name, (DVotingEvalModel,), attributes)


# One class per `--model` name, named as pyproject's entry points and plugin.MODELS name them
# (`ModelName.class_name`): LLaDAEvalModel (dvoting-llada), DreamEvalModel (dvoting-dream),
# LLaDA2EvalModel (dvoting-llada2), LLaDA21EvalModel (dvoting-llada21). Built, not written out,
# so that a new name is one record in models/families.py.
EVAL_MODELS: dict[str, type[DVotingEvalModel]] = {
    name: _eval_model_class(spec) for name, spec in MODEL_NAMES.items()
}
globals().update({model.__name__: model for model in EVAL_MODELS.values()})
