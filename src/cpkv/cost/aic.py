"""The one module that talks to aiconfigurator (the optional ``cost`` extra; SPEC C-COST).

aiconfigurator (ai-dynamo, Apache-2.0, PyPI ``aiconfigurator-core``) ships measured operator latencies of
GPU systems and builds a model's operator list from its Hugging Face config. ``price_tables`` builds two
of its engines, the model on one GPU (attention, norms, LM head, decode attention) and the model on the
CP group's GPUs as aiconfigurator composes DeepSeek-V3.2 prefill CP on SGLang (``cp_size`` ranks, MoE
expert-parallel over them: the MoE block and its all-gather / reduce-scatter of hidden states), and
samples each operator class it needs over a grid of sizes into monotone tables (``tables.PriceTables``).
What owner lanes change is left out on purpose: aiconfigurator's CP attention adds a per-layer all-gather
of the KV, which direct writes into owner lanes do not need, and splits each rank's queries evenly,
where cpkv prices each rank's own runs from its plan (``measured.MeasuredCost``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from functools import lru_cache, partial
from importlib import import_module, metadata

import numpy as np

from .comm import CommCost
from .grid import Curve, Surface
from .spec import EXTRA, CostExtraMissing, CostModelError, MeasuredSpec
from .tables import PriceTables

SIZES = np.unique(np.r_[2 ** np.arange(0, 22), 3 * 2 ** np.arange(0, 21)]).astype(
    np.int64
)  # 1 .. 2 Mi tokens
"""Token counts the tables are sampled at (1, 2, 3, 4, 6, 8, 12, ... 2**21), about 20 % apart at most."""
PREFIXES = np.r_[0, SIZES]
DECODE_BATCH = SIZES[SIZES <= 2**16]

# Operator classes of the DeepSeek sparse-attention models' op lists (aiconfigurator 0.12, one GPU or
# plain CP; the large-EP graphs are not composed), by operator name.
_CONTEXT = {
    "context_embedding": "per_token",
    "context_add_norm_1": "per_token",
    "context_add_norm_2": "per_token",
    "context_attention": "attention",
    "context_shared_gate_up_gemm": "group",
    "context_shared_act_gate": "group",
    "context_shared_ffn2_gemm": "group",
    "context_router_gemm": "group",
    "context_moe": "group",
    "context_moe_pre_dispatch": "dispatch",
    "context_moe_post_dispatch": "dispatch",
    "context_logits_gemm": "logits",
    "context_p2p": "pipeline",
}
_GENERATION = {
    "generation_embedding": "per_token",
    "generation_add_norm_1": "per_token",
    "generation_add_norm_2": "per_token",
    "generation_attention": "attention",
    "generation_moe_overlap": "group",
    "generation_logits_gemm": "logits",
    "generation_p2p": "pipeline",
}


def load_aiconfigurator():
    """Import aiconfigurator's SDK, or raise ``CostExtraMissing`` naming the extra that installs it."""
    try:
        return import_module("aiconfigurator_core.sdk.engine"), import_module("aiconfigurator_core")
    except ImportError as e:
        raise CostExtraMissing(
            f"the measured cost model needs aiconfigurator ({e.name or 'aiconfigurator_core'} is not "
            f"installed): pip install '.[{EXTRA}]' in a cpkv checkout, or use the illustrative model "
            "(--cost-model illustrative)"
        ) from None


def aiconfigurator_version() -> str:
    """The installed ``aiconfigurator-core`` version."""
    return metadata.version("aiconfigurator-core")


def _guard(what: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, aiconfigurator's errors (of any type) raised as one ``CostModelError``."""
    try:
        return fn(*args, **kwargs)
    except CostModelError:
        raise
    except (
        Exception
    ) as e:  # aiconfigurator raises ValueError, AssertionError, its own PerfDataNotAvailableError
        text = " ".join(str(e).split()) or type(e).__name__
        raise CostModelError(f"aiconfigurator cannot price {what}: {text}") from None


@lru_cache(maxsize=8)
def _database(gpu: str, backend: str):
    """``(version, database)``: aiconfigurator's current measurements of ``backend`` on ``gpu``."""
    from aiconfigurator_core.sdk import perf_database

    where = f"gpu {gpu!r}, backend {backend!r}"
    version = _guard(where, perf_database.resolve_query_version, gpu, backend, "current")
    db = _guard(where, perf_database.get_database, gpu, backend, version)
    if db is None:
        raise CostModelError(f"aiconfigurator has no {backend} measurements for gpu {gpu!r}")
    return version, db


def measured_database(gpu: str, backend: str):
    """``(version, database)``: aiconfigurator's current measurements of ``backend`` on ``gpu`` (kept);
    CostModelError where it has none."""
    return _database(gpu, backend)


def guarded(what: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, aiconfigurator's errors raised as one ``CostModelError`` naming ``what``."""
    return _guard(what, fn, *args, **kwargs)


class _Engine:
    """One compiled aiconfigurator engine and its operator lists, indexed by cpkv's operator classes."""

    def __init__(self, spec: MeasuredSpec, cp_size: int, ep_size: int) -> None:
        engine_mod, core = load_aiconfigurator()
        from aiconfigurator_core.sdk.config import ModelConfig
        from aiconfigurator_core.sdk.models import get_model

        where = f"gpu {spec.gpu!r}, model {spec.model!r}, backend {spec.backend!r}"
        self.version, db = _database(spec.gpu, spec.backend)
        self.database = db
        config = ModelConfig(tp_size=1, cp_size=cp_size, moe_tp_size=cp_size // ep_size, moe_ep_size=ep_size)
        what = f"{where} at cp_size {cp_size}, ep_size {ep_size}"
        model = _guard(what, get_model, spec.model, config, spec.backend)
        spec_json = _guard(
            what,
            engine_mod.build_engine_spec_json,
            model,
            model_path=spec.model,
            system=spec.gpu,
            backend=spec.backend,
            backend_version=self.version,
            kv_block_size=None,
            systems_path=None,
            nextn=0,
            database=db,
        )
        wire = _guard(what, core.engine_spec_bincode_from_json, spec_json)
        self.handle = _guard(what, engine_mod.EngineHandle, bytes(wire))
        self.what = what
        self.ops = {}  # phase -> {class: [(index, op spec)]}
        phases = (("context", model.context_ops, _CONTEXT), ("generation", model.generation_ops, _GENERATION))
        for phase, ops, names in phases:
            classes: dict[str, list[tuple[int, dict]]] = {}
            for i, op in enumerate(json.loads(engine_mod.build_ops_json(ops))):
                kind, fields = next(iter(op.items()))
                cls = names.get(fields["name"])
                if cls is None:
                    raise CostModelError(
                        f"cpkv cannot compose {spec.model!r}: its {phase} operator {fields['name']!r} "
                        f"({kind}) is not one of a DeepSeek sparse-attention model's"
                    )
                classes.setdefault(cls, []).append((i, {"kind": kind, **fields}))
            self.ops[phase] = classes
        if [op["kind"] for _, op in self.ops["context"].get("attention", [])] != ["DsaContext"]:
            raise CostModelError(
                f"cpkv composes DeepSeek sparse-attention (DSA) models; {spec.model!r} has none"
            )

    def indices(self, phase: str, cls: str) -> list[int]:
        return [i for i, _ in self.ops[phase].get(cls, [])]

    def op(self, phase: str, cls: str) -> dict:
        return self.ops[phase][cls][0][1]

    def context(self, cls: str, s: int, prefix: int = 0, x: int | None = None) -> float:
        idx = self.indices("context", cls)
        if not idx:
            return 0.0
        out = _guard(
            f"{self.what}: {cls} at {s} tokens after {prefix}",
            self.handle.evaluate_context_ops,
            idx,
            batch_size=1,
            s=int(s),
            prefix=int(prefix),
            x=x,
        )
        return float(sum(v for _, v, _, _ in out))

    def generation(self, cls: str, batch: int, kv_len: int) -> float:
        idx = self.indices("generation", cls)
        if not idx:
            return 0.0
        out = _guard(
            f"{self.what}: decode {cls} of {batch} tokens over {kv_len} keys",
            self.handle.evaluate_generation_ops,
            idx,
            batch_size=int(batch),
            s=int(kv_len),
        )
        return float(sum(v for _, v, _, _ in out))


def _curve(fn, sizes: np.ndarray = SIZES) -> Curve:
    """``fn`` sampled at ``sizes``, and 0 ms at size 0 (no token, no work)."""
    return Curve(np.r_[0, sizes], [0.0, *(fn(int(n)) for n in sizes)])


def _sample_collective(spec: MeasuredSpec, op: str, num_gpus: int, elements: np.ndarray) -> np.ndarray:
    """``CommCost``'s sampler (bound to ``spec`` with ``functools.partial``: picklable, so tables travel to
    other processes): aiconfigurator's NCCL op over whole-buffer sizes (16-bit elements)."""
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import operations as core_ops

    engine = _one_gpu_engine(spec)
    nccl = core_ops.NCCL(op, 1, op, 1, num_gpus, common.CommQuantMode.half)
    ops_json = import_module("aiconfigurator_core.sdk.engine").build_ops_json([nccl])
    what = f"{engine.what}: NCCL {op} over {num_gpus} GPUs"
    return np.array(
        [
            _guard(what, engine.handle.evaluate_ops_json, ops_json, is_context=True, batch_size=1, s=int(n))[
                0
            ][1]
            for n in elements
        ]
    )


@lru_cache(maxsize=8)
def _one_gpu_engine(spec: MeasuredSpec) -> _Engine:
    """The model on one GPU (its parallel widths are 1 whatever ``spec.ep_size``)."""
    return _Engine(spec, 1, 1)


_PRICED: dict[tuple[MeasuredSpec, int], PriceTables] = {}


def price_tables(spec: MeasuredSpec, cp_size: int) -> PriceTables:
    """The measured price tables of a group of ``cp_size`` GPUs (1.5-2 s the first time in a process, then
    kept; the one-GPU part is shared by every ``cp_size``, so a further one takes milliseconds). The
    group's all-gather over ``cp_size`` GPUs is sampled too, so the tables price every step without
    aiconfigurator in another process (``install_tables``).

    Raises:
        CostExtraMissing: aiconfigurator is not installed.
        CostModelError: aiconfigurator has no measurement for ``spec`` at this ``cp_size`` / ``ep_size``,
            or the model is not a DeepSeek sparse-attention model.
    """
    tables = _PRICED.get((spec, cp_size))
    if tables is None:
        tables = _PRICED[spec, cp_size] = _price_tables(spec, cp_size)
    return tables


def install_tables(tables: dict[tuple[MeasuredSpec, int], PriceTables]) -> None:
    """Make ``tables`` (``(spec, cp_size) -> PriceTables`` that another process priced; picklable) what
    ``price_tables`` returns here, so a worker prices steps without sampling aiconfigurator again. Keyed
    by the exact ``(spec, cp_size)``: ``MeasuredSpec(ep_size=2)`` is not ``MeasuredSpec()`` even where the
    widths agree (it samples)."""
    _PRICED.update(tables)


def _price_tables(spec: MeasuredSpec, cp_size: int) -> PriceTables:
    """Sample the tables: on one GPU everything, in a group only the MoE block and its dispatch over the
    group's GPUs, on top of the one-GPU tables (``price_tables(spec without ep_size, 1)``, shared)."""
    ep = spec.ep_for(cp_size)
    one_spec = replace(spec, ep_size=None)  # one GPU: no expert parallelism
    if cp_size == 1:
        return _one_gpu_tables(one_spec) if spec == one_spec else price_tables(one_spec, 1)
    group = _Engine(spec, cp_size, ep)
    tables = replace(
        price_tables(one_spec, 1),
        cp_size=cp_size,
        ep_size=ep,
        moe_tp_size=cp_size // ep,
        group=_curve(lambda n: group.context("group", n)),
        dispatch=_curve(lambda n: group.context("dispatch", n)),
        gen_group=_curve(lambda b: group.generation("group", b, 1), DECODE_BATCH),
    )
    tables.comm.curve("all_gather", cp_size)  # the gather-back's and the KV designs' collective
    return replace(tables, provenance=_provenance(spec, _one_gpu_engine(one_spec), tables))


def _one_gpu_tables(spec: MeasuredSpec) -> PriceTables:
    """Every table of the model on one GPU (``cp_size`` 1), with its provenance."""
    from aiconfigurator_core.sdk.operations.dsa import DSA_MODEL_DIMS

    one = _one_gpu_engine(spec)
    attention_op = one.op("context", "attention")
    dims = DSA_MODEL_DIMS[attention_op["architecture"]]
    attention = np.array([[one.context("attention", s, p) for p in PREFIXES] for s in SIZES])
    gen_attention = np.array([[one.generation("attention", b, L) for L in SIZES] for b in DECODE_BATCH])
    # The indexer's share: the module's cost per extra key at long contexts (8,192 queries after 64k and
    # 128k keys, both measured), per logits element.
    far = one.context("attention", 8192, 131072) - one.context("attention", 8192, 65536)
    tables = PriceTables(
        cp_size=1,
        ep_size=1,
        moe_tp_size=1,
        num_layers=int(attention_op["scale_factor"]),
        hidden_size=int(one.op("context", "per_token")["hidden_size"]),
        index_topk=int(attention_op["index_topk"]),
        kv_row_bytes=(dims["kv_lora_rank"] + dims["qk_rope_head_dim"]) * 2 + dims["index_head_dim"] + 4,
        kv_gather_row_bytes=(dims["kv_lora_rank"] + dims["qk_rope_head_dim"] + dims["index_head_dim"]) * 2,
        attention=Surface(SIZES, PREFIXES, attention),
        per_token=_curve(lambda n: one.context("per_token", n)),
        group=_curve(lambda n: one.context("group", n)),
        dispatch=_curve(lambda n: one.context("dispatch", n)),
        logits=_curve(lambda n: one.context("logits", 1, x=n)),
        gen_attention=Surface(DECODE_BATCH, SIZES, gen_attention),
        gen_per_token=_curve(lambda b: one.generation("per_token", b, 1), DECODE_BATCH),
        gen_group=_curve(lambda b: one.generation("group", b, 1), DECODE_BATCH),
        gen_logits=_curve(lambda b: one.generation("logits", b, 1), DECODE_BATCH),
        indexer_ms_per_element=max(far, 0.0) / (8192 * 65536),
        comm=CommCost(partial(_sample_collective, spec)),
    )
    return replace(tables, provenance=_provenance(spec, one, tables))


def _provenance(spec: MeasuredSpec, one: _Engine, tables: PriceTables) -> dict:
    """What priced the tables, for report.json: names, versions and a digest of the sampled tables."""
    digest = hashlib.sha256()
    for table in (tables.attention, tables.gen_attention):
        digest.update(table.z.tobytes())
    for curve in (
        tables.per_token,
        tables.group,
        tables.dispatch,
        tables.logits,
        tables.gen_per_token,
        tables.gen_group,
        tables.gen_logits,
    ):
        digest.update(curve.y.tobytes())
    nccl = (one.database.system_spec.get("misc") or {}).get("nccl_version")
    return {
        "cost_model": "measured",
        "gpu": spec.gpu,
        "model": spec.model,
        "backend": spec.backend,
        "backend_version": one.version,
        "nccl_version": nccl,
        "data_version": f"{spec.backend} {one.version}, nccl {nccl}",
        "aiconfigurator_version": aiconfigurator_version(),
        "cp_size": tables.cp_size,
        "ep_size": tables.ep_size,
        "moe_tp_size": tables.moe_tp_size,
        "num_layers": tables.num_layers,
        "tables_sha256": digest.hexdigest()[:16],
    }
