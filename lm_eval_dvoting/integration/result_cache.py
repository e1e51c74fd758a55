"""`--use_cache` made exact: entries bound to the run's configuration and to each
(document, repeat).

lm-eval's `CachingLM` (0.4.13) keys a result on the request alone, ``(context, gen_kwargs)``,
and reads the cache before it calls the model. For this plugin that gave two kinds of
silently wrong results:

1. A cache written under one configuration answered another: a `strategy=single` run's
   texts came back for a later `strategy=dvoting` run (or another checkpoint, seed, `n`,
   `alpha`, `temperature`, `dtype`, ...).
2. Identical requests were merged: with `repeats: N` (or two documents with the same
   question) every repeat got the one text stored last, while the run that wrote the cache
   drew a different sample per document and repeat (`derive_seed` uses both).

What this module does instead. When lm-eval wraps the model in `CachingLM`, it hands the
model a `CacheHook` (`set_cache_hook`); `bind` then

* installs `ResultCache.serve` on that `CachingLM` instance as its `generate_until`,
  `loglikelihood` and `loglikelihood_rolling` (instance attributes win over
  `CachingLM.__getattr__`), so lm-eval's own lookup never runs for this plugin;
* keys every entry on the run's **fingerprint** (`fingerprint`) plus the request, and a
  generation additionally on its task, document and repeat index (`generation_key_args`),
  which is exactly what decides its seed. A loglikelihood is keyed on its text pair alone,
  as its seed is (identical pairs give identical scores, so sharing them is exact);
* keeps lm-eval's sqlite file (`PATH_rank{i}.db`, one per rank) and its table, so cached
  values stay the objects `generate_until` returned (`CostedText`, with its cost).

**Each configuration gets its own entries** (the alternative, refusing a cache written
under other settings, was not chosen): one cache path can serve a sweep over strategies,
seeds or checkpoints, and a run only ever reads entries written under its own fingerprint.
A configuration new to the file is named in one WARNING, with the settings in which it
differs from the closest configuration already stored, so a surprising full recompute is
explained. Entries of other configurations are kept, never read.

The fingerprint holds everything that decides outputs (`fingerprint` lists it): the
checkpoint's identity (a hub id with the commit loaded, else the sha256 of its config and
weight files), the tokenizer files' sha256, every resolved strategy setting that the
strategy, its commit rule or its vote reads (one that none reads, e.g. `guidance` without
rfg, changes no output and is left out: `strategies.unused_settings`), the seed,
`mc_num`, dtype, device type, `max_length`, `add_bos_token`, the plugin's version and code, and in
bfloat16/float16 or on an accelerator also the batch rows (where outputs may depend on the
batch: `batch_dependent`), and `cached_steps=compiled` (its fused kernels round otherwise
than the eager ones; the other modes give the same tokens and share entries).
Not in it: library versions (torch, transformers, lm-eval,
math-verify, sympy) and the machine, and what is in the
request itself (the prompt, few-shot examples, chat template output, `--gen_kwargs`).

Weight files are hashed for real (sha256 of the bytes, streamed once: 0.7 GB/s on the 2-core
development CPU, about 20 s for the 16 GB of an 8B checkpoint) rather than by header, size and
time: a fine-tuned checkpoint has the header and size of its base, and copies keep times.
The digest is remembered in the cache file by path, size,
modification and change time and inode, so later runs with an unchanged file do not read it
again, and any rewrite of the file (which updates its change time) hashes it anew.

Several processes may share one cache file (two runs started with the same `--use_cache`):
sqlite serialises their writes, equal configurations write equal values under equal keys,
and different configurations never share a key.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from lm_eval_dvoting import __version__
from lm_eval_dvoting.core.settings import used_settings
from lm_eval_dvoting.integration.lm_eval_seam import answer_for_caching_lm, calling_caching_lm
from lm_eval_dvoting.integration.requests import (
    generation_key_args,
    repeat_indices,
    sanitise_requests,
)
from lm_eval_dvoting.models.loading import TOKENIZER_FILES, hub_revision, weight_files

log = logging.getLogger(__name__)

# the request types lm-eval calls on the model (and on its CachingLM)
REQUEST_TYPES = ("generate_until", "loglikelihood", "loglikelihood_rolling")
KEY_PREFIX = "dvoting:"
# beside lm-eval's result table ("unnamed") in the same file: fingerprints and file digests
META_TABLE = "dvoting_meta"
# dtypes whose outputs may depend on the rows sharing a forward pass (README, Reproducibility)
BATCH_DEPENDENT_DTYPES = ("bfloat16", "float16")
_CHUNK = 1 << 24

# digests computed in this process: (real path, stat signature) -> sha256
_DIGESTS: dict[tuple[str, tuple[int, ...]], str] = {}


# ------------------------------------------------------------------ request keys


def entry_key(fingerprint_id: str, attr: str, args: Any) -> str:
    """The cache key of one result: the configuration's id, the request type and its key args."""
    text = json.dumps([fingerprint_id, attr, *args], sort_keys=True, default=_json_default)
    return KEY_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars (e.g. a doc_id)
        return obj.item()
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes_sha256__": hashlib.sha256(bytes(obj)).hexdigest()}
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    # no repr fallback: an unstable repr would make a key that never hits again
    raise TypeError(
        f"result cache: a request holds a {type(obj).__name__}, which has no stable key"
    )


# ------------------------------------------------------------------ fingerprint


def file_digest(path: Path, memo: dict[str, Any] | None = None) -> str:
    """sha256 of a file's bytes, reused while its size, times and inode stay the same.

    `memo` (the cache file's meta table) keeps digests across runs; `_DIGESTS` within one.
    """
    real = os.path.realpath(path)
    st = os.stat(real)
    signature = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    known = _DIGESTS.get((real, signature))
    if known is None and memo is not None:
        stored = memo.get("digest:" + real)
        if stored and tuple(stored["stat"]) == signature:
            known = stored["sha256"]
    if known is None:
        if st.st_size > 1 << 30:
            log.info(
                "result cache: hashing %s (%.1f GB) once for the cache fingerprint",
                real,
                st.st_size / 1e9,
            )
        digest = hashlib.sha256()
        with open(real, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                digest.update(chunk)
        known = digest.hexdigest()
    _DIGESTS[real, signature] = known
    record = {"stat": list(signature), "sha256": known}
    if memo is not None and memo.get("digest:" + real) != record:
        memo["digest:" + real] = record
    return known


def _files_digest(files: list[Path], root: Path, memo: dict[str, Any] | None) -> str:
    lines = [
        f"{file.relative_to(root).as_posix()} {file_digest(file, memo)}" for file in sorted(files)
    ]
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def checkpoint_identity(lm: Any, memo: dict[str, Any] | None = None) -> str:
    """A hub checkpoint: its id, the commit loaded and the subfolder. Otherwise (a local folder,
    a packaged demo name): sha256 over its config and weight files, wherever it lies."""
    revision = getattr(lm, "revision", None)
    if revision:
        subfolder = getattr(lm, "subfolder", None)
        return f"hub:{lm.pretrained}@{revision}" + (f"/{subfolder}" if subfolder else "")
    source = getattr(lm.model, "source", None)
    if source is None:
        return "parameters:" + _parameters_digest(lm.model)
    folder = Path(source)
    files = [folder / "config.json", *weight_files(folder)]
    files += (
        [folder / "generation_config.json"] if (folder / "generation_config.json").exists() else []
    )
    return "sha256:" + _files_digest(files, folder, memo)


def _reference_identity(lm: Any, memo: dict[str, Any] | None) -> str | None:
    reference = getattr(lm, "reference_model", None)
    if reference is None:
        return None
    source = getattr(reference, "source", None)
    revision = None if source is None else hub_revision(source)
    return checkpoint_identity(
        SimpleNamespace(
            model=reference, pretrained=lm.reference, revision=revision, subfolder=None
        ),
        memo,
    )


def _parameters_digest(model: Any) -> str:
    """sha256 of the loaded tensors (a model not read from a folder, e.g. built in Python)."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode("utf-8"))
        digest.update(
            tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        )
    return digest.hexdigest()


def tokenizer_identity(tokenizer: Any, memo: dict[str, Any] | None = None) -> str:
    """sha256 over the tokenizer's data files (vocabulary, merges, special tokens, chat
    template)."""
    folder = Path(str(getattr(tokenizer, "name_or_path", "")))
    if folder.is_dir():
        files = [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
        files += sorted(folder.glob("*.jinja"))
        if files:
            return "sha256:" + _files_digest(files, folder, memo)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # a fast tokenizer's full definition, with its chat template
        text = backend.to_str() + str(getattr(tokenizer, "chat_template", None))
        return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    raise ValueError(
        f"--use_cache: cannot identify the tokenizer {folder} (no data files, not a fast "
        "tokenizer); run without --use_cache"
    )


@functools.lru_cache(maxsize=1)
def plugin_code_digest() -> str:
    """sha256 over the plugin's own Python files.

    The version number alone would let an edited (editable-install) or patched copy of the
    plugin replay results its older code wrote; any change to the code gets new entries.
    Computed once per process: the code that runs is the code imported at its start.
    """
    package = Path(__file__).resolve().parents[1]
    files = sorted(package.rglob("*.py"))
    return _files_digest(files, package, None)


def fingerprint(lm: Any, memo: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything that decides this model's outputs for a given request, flat and by model-arg name.

    checkpoint, tokenizer, the resolved strategy settings that the strategy, its commit rule
    or its vote reads (`settings.used_settings`, as `settings_used` reports them; `max_gen_toks`
    is the default length, a task's own is in the request), seed, mc_num, dtype, device
    (its type), max_length, add_bos_token, the plugin version and code, `batch_rows` where
    `batch_dependent`, and `cached_steps` where it is `compiled`.
    """
    # only the settings this decode reads (the others decide nothing), resolved; `decoder` as
    # given and no `steps_run` (it follows from `steps`), as the fingerprint always had them
    resolved = used_settings(lm.settings)
    resolved["max_gen_toks"] = resolved.pop("gen_length")
    resolved.pop("steps_run", None)
    resolved["decoder"] = lm.settings.decoder
    dtype = lm.dtype_name
    identity = {
        "plugin_version": __version__,
        "plugin_code": plugin_code_digest(),
        "checkpoint": checkpoint_identity(lm, memo),
        # the LoRA adapter on it (a digest of its two files), None without one
        "peft": None if getattr(lm, "adapter", None) is None else lm.adapter.identity,
        # RFG's reference model, identified as the checkpoint is (None without one)
        "reference": _reference_identity(lm, memo),
        "tokenizer": tokenizer_identity(lm.tokenizer, memo),
        "add_bos_token": bool(getattr(lm, "add_bos_token", False)),
        "dtype": dtype,
        "device": lm.device.type,
        "max_length": int(lm.max_length),
        "seed": int(lm.seed),
        "mc_num": int(lm.mc_num),
        **resolved,
    }
    if batch_dependent(lm):
        identity["batch_rows"] = int(lm.batch_rows)
    # the one `cached_steps` mode whose tokens may differ from the others' (its fused kernels
    # round otherwise); the others give the same tokens, so their entries stay shared
    if getattr(lm, "cached_steps", None) == "compiled":
        identity["cached_steps"] = "compiled"
    return identity


def batch_dependent(lm: Any) -> bool:
    """Whether outputs may move with the rows sharing a forward pass: bfloat16/float16, or any
    dtype on an accelerator, whose kernels are chosen by shape (README, Reproducibility)."""
    return lm.dtype_name in BATCH_DEPENDENT_DTYPES or lm.device.type != "cpu"


def fingerprint_id(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:32]


def differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`name: stored -> current` for every setting that differs (values shortened)."""

    def show(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."

    names = sorted(set(stored) | set(current))
    return [
        f"{name}: {show(stored.get(name))} -> {show(current.get(name))}"
        for name in names
        if stored.get(name) != current.get(name)
    ]


# ------------------------------------------------------------------ the cache


class ResultCache:
    """The model's cache hook while `--use_cache` is on, and the server of its cached results.

    `add_partial(attr, key_args, result)` stores a result as soon as it is computed (the
    model calls it, as lm-eval's `CacheHook` is called), so an interrupted run resumes;
    `serve(attr, requests)` answers lm-eval's call for a request type from the cache and
    hands only the missing requests to the model.
    """

    def __init__(self, lm: Any, dbdict: Any) -> None:
        self.lm = lm
        self.dbdict = dbdict  # lm-eval's SqliteDict of PATH_rank{i}.db (CacheHook's name for it)
        self.path = str(dbdict.filename)
        self._known: dict[
            str, str
        ] = {}  # fingerprint json -> id, for configurations already registered
        # fingerprint (hashing the weights if needed) and report, before any request
        self.current_id()

    @contextlib.contextmanager
    def _meta(self) -> Iterator[Any]:
        from sqlitedict import SqliteDict

        with SqliteDict(self.path, tablename=META_TABLE, autocommit=False) as meta:
            yield meta
            meta.commit()

    def current_id(self) -> str:
        """The id of the model's configuration now (a strategy switch changes it).

        File digests come from this process's memo after the first call (a file whose size,
        times or inode changed is hashed again); a configuration new to this process is
        registered in the file's meta table, with digests remembered there for later runs.
        """
        identity = fingerprint(self.lm, None) if self._known else None
        text = None if identity is None else json.dumps(identity, sort_keys=True)
        if text in self._known:
            return self._known[text]
        # hash from a snapshot, outside any write transaction: another process sharing the
        # file must not wait on (and time out behind) a lock held while 16 GB are read
        with self._meta() as meta:
            memo = {key: value for key, value in meta.items() if key.startswith("digest:")}
        known = dict(memo)
        identity = fingerprint(self.lm, memo)
        with self._meta() as meta:
            for key, value in memo.items():
                if known.get(key) != value:
                    meta[key] = value
            return self._register(identity, json.dumps(identity, sort_keys=True), meta)

    def _register(self, identity: dict[str, Any], text: str, meta: Any) -> str:
        ident = fingerprint_id(identity)
        self._known[text] = ident
        key = "fingerprint:" + ident
        if key in meta:
            log.info(
                "result cache %s: configuration %s (results of earlier runs are used)",
                self.path,
                ident[:12],
            )
            return ident
        others = [value for name, value in meta.items() if name.startswith("fingerprint:")]
        meta[key] = {"fingerprint": identity, "pretrained": getattr(self.lm, "pretrained", None)}
        if others:
            closest = min(
                others, key=lambda other: len(differences(other["fingerprint"], identity))
            )
            log.warning(
                "result cache %s holds results of %d other configuration(s), none of this one, "
                "so every request is computed (their entries are kept apart and never used); "
                "the closest was made "
                "with pretrained=%s and differs in %s",
                self.path,
                len(others),
                closest.get("pretrained"),
                "; ".join(differences(closest["fingerprint"], identity)),
            )
        return ident

    def add_partial(self, attr: str, key_args: Any, result: Any) -> None:
        """Store one computed result (a generation's key args come from `generation_key_args`)."""
        self.dbdict[entry_key(self.current_id(), attr, key_args)] = result

    def serve(self, attr: str, requests: list[Any], **kwargs: Any) -> list[Any]:
        """lm-eval's call for one request type: cached results, the rest computed by the model."""
        # before the keys: a request answered from the cache never reaches the model, and its
        # text must still be what lm-eval's --log_samples hashing can encode
        sanitise_requests(requests)
        ident = self.current_id()
        if attr == "generate_until":
            key_args = [
                generation_key_args(r, k) for r, k in zip(requests, repeat_indices(requests))
            ]
        else:
            key_args = [tuple(r.args) for r in requests]
        keys = [entry_key(ident, attr, args) for args in key_args]
        results: list[Any] = [None] * len(requests)
        found = [False] * len(requests)
        for position, key in enumerate(keys):
            with contextlib.suppress(KeyError):
                results[position] = self.dbdict[key]
                found[position] = True
        todo = self._to_compute(attr, requests, found)
        log.info(
            "result cache %s: %d of %d '%s' requests cached, %d to compute",
            self.path,
            sum(found),
            len(requests),
            attr,
            len(todo),
        )
        if todo:
            computed = getattr(self.lm, attr)([requests[p] for p in todo], **kwargs)
            for position, result in zip(todo, computed, strict=True):
                results[position] = result
                # also stored by the model as each finishes; again here, so nothing is missed
                self.dbdict[keys[position]] = result
        self.dbdict.commit()
        return results

    @staticmethod
    def _to_compute(attr: str, requests: list[Any], found: list[bool]) -> list[int]:
        """The positions to hand to the model: the uncached ones, and for a generation every
        position of an instance with one uncached repeat, so that the model numbers the
        repeats (and seeds them) as the run that wrote the cache did. Such repeats are
        decoded again and give the cached texts again."""
        if attr != "generate_until":
            return [p for p, hit in enumerate(found) if not hit]
        positions: dict[int, list[int]] = defaultdict(list)
        for position, req in enumerate(requests):
            positions[id(req)].append(position)
        todo = {
            p for group in positions.values() if not all(found[q] for q in group) for p in group
        }
        return sorted(todo)


def bind(lm: Any, hook: Any) -> Any:
    """What `set_cache_hook` stores: `hook` itself without a cache, else a `ResultCache` that
    also answers for the `CachingLM` that made `hook` (found on the call stack: lm-eval
    calls `set_cache_hook` from `CachingLM.__init__`)."""
    if getattr(hook, "dbdict", None) is None:
        return hook
    wrapper = calling_caching_lm(lm, hook)
    if wrapper is None:
        raise RuntimeError(
            "--use_cache: lm-eval's CachingLM that made this cache hook was not found, so "
            "cached results could not be bound to this run's settings (an lm-eval other than "
            "0.4.x?); run without --use_cache"
        )
    cache = ResultCache(lm, hook.dbdict)
    if batch_dependent(lm):
        log.warning(
            "--use_cache in %s on %s: a resumed run may differ from an uninterrupted one at "
            "near-tie decisions, as a change of --batch_size may (the requests sharing a forward "
            "pass differ); each stored result is exact for its configuration (README, "
            "Reproducibility)",
            lm.dtype_name,
            lm.device.type,
        )
    answer_for_caching_lm(wrapper, {attr: _server(cache, attr) for attr in REQUEST_TYPES})
    return cache


def _server(cache: ResultCache, attr: str) -> Callable[..., list[Any]]:
    def serve(requests: list[Any], **kwargs: Any) -> list[Any]:
        return cache.serve(attr, requests, **kwargs)

    serve.__name__ = attr
    return serve
