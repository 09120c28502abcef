"""Where aiconfigurator's installed measurements end (SPEC C-COST; docs/cost-model.md, "Where the data ends").

aiconfigurator ships its measurements as files under ``aiconfigurator_core/systems/data/<gpu>/``: the DSA
context module of each engine (``sparse_attention/<backend>/<version>/dsa_context_module_perf.parquet``,
rows per model, query length ``isl`` and earlier keys ``step``) and NCCL collectives
(``comm/nccl/<version>/nccl_perf.parquet``, over ``num_gpus`` GPUs of one node). ``check_covered`` refuses a
GPU / engine / model combination those files do not hold, in one line naming what they hold;
``extrapolated`` names the parts of a run priced past them (more GPUs than the collectives were measured
over, runs longer than the measured queries, contexts past the measured keys).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .spec import CostModelError, MeasuredSpec

DSA_FILE = "dsa_context_module_perf.parquet"
NCCL_FILE = "nccl_perf.parquet"
CP_BACKENDS = ("sglang",)
"""Engines aiconfigurator composes context-parallel prefill of a DSA model for (its model classes'
``supports_cp``; vLLM and TensorRT-LLM price ``cp_size`` 1 only)."""

ERROR_BAND = "aiconfigurator's published TTFT MAPE: 29.9 % for GLM-5 on SGLang (67 points), 51.7 % over its cohort (728 points)"
"""The published accuracy of the tables behind every measured time (aiconfigurator's docs, as issue 35 quotes
them): each absolute time cpkv prints under ``--cost-model measured`` carries it."""
ILLUSTRATIVE_BAND = "illustrative constants: no error band (not a GPU's times)"


def data_root() -> Path:
    """aiconfigurator's installed measurement directory, found without importing aiconfigurator
    (``CostExtraMissing`` without the ``cost`` extra)."""
    from importlib.util import find_spec

    from .aic import load_aiconfigurator

    try:
        found = find_spec("aiconfigurator_core")
    except ImportError:  # an import hook that refuses it: as not installed
        found = None
    if found is None or found.origin is None:
        load_aiconfigurator()  # raises CostExtraMissing naming the extra
    return Path(found.origin).parent / "systems" / "data"  # type: ignore[union-attr,arg-type]  # found: load_aiconfigurator raised otherwise


@lru_cache(maxsize=1)
def dsa_tables() -> dict[tuple[str, str], tuple[Path, ...]]:
    """``{(gpu, backend): DSA context-module files}`` that the installed aiconfigurator holds."""
    out: dict[tuple[str, str], list[Path]] = {}
    for f in sorted(data_root().glob(f"*/sparse_attention/*/*/{DSA_FILE}")):
        out.setdefault((f.parts[-5], f.parts[-3]), []).append(f)
    return {k: tuple(v) for k, v in out.items()}


@lru_cache(maxsize=16)
def dsa_models(gpu: str, backend: str) -> dict[str, tuple[int, int]]:
    """``{model: (longest measured query run, most measured earlier keys)}`` of ``backend`` on ``gpu`` (tokens)."""
    import pandas as pd

    out: dict[str, tuple[int, int]] = {}
    for f in dsa_tables().get((gpu, backend), ()):
        frame = pd.read_parquet(f, columns=["model", "isl", "step"])
        for model, rows in frame.groupby("model"):
            isl, step = out.get(model, (0, 0))
            out[str(model)] = (max(isl, int(rows["isl"].max())), max(step, int(rows["step"].max())))
    return out


@lru_cache(maxsize=16)
def nccl_gpus(gpu: str) -> int:
    """The most GPUs aiconfigurator's NCCL tables of ``gpu`` were measured over (0 with none)."""
    import pandas as pd

    files = sorted(data_root().glob(f"{gpu}/comm/nccl/*/{NCCL_FILE}"))
    return max((int(pd.read_parquet(f, columns=["num_gpus"])["num_gpus"].max()) for f in files), default=0)


def check_covered(spec: MeasuredSpec, cp_size: int) -> None:
    """Refuse, in one line naming what the installed data holds, a ``spec`` it cannot price at ``cp_size``.

    Raises:
        CostModelError: no DSA measurements of ``spec.backend`` on ``spec.gpu`` (names the GPUs that have
            them, and the engines on this GPU); none of ``spec.model`` there (names the models that have
            them); CP (``cp_size > 1``) on an engine aiconfigurator composes no CP for (``CP_BACKENDS``).
        CostExtraMissing: aiconfigurator is not installed.
    """
    tables = dsa_tables()
    if (spec.gpu, spec.backend) not in tables:
        gpus = sorted({g for g, b in tables if b == spec.backend})
        here = sorted({b for g, b in tables if g == spec.gpu})
        raise CostModelError(
            f"aiconfigurator holds no {spec.backend} measurements of a DeepSeek sparse-attention model on gpu "
            f"{spec.gpu!r}; {spec.backend} has them on {', '.join(gpus) or 'no gpu'}"
            + (f"; {spec.gpu} has them for {', '.join(here)}" if here else "")
        )
    models = dsa_models(spec.gpu, spec.backend)
    if spec.model not in models:
        raise CostModelError(
            f"aiconfigurator holds no {spec.backend} measurements of {spec.model!r} on {spec.gpu}; "
            f"it holds {', '.join(sorted(models))}"
        )
    if cp_size > 1 and spec.backend not in CP_BACKENDS:
        raise CostModelError(
            f"aiconfigurator composes context-parallel prefill of {spec.model} only on "
            f"{', '.join(CP_BACKENDS)}; --backend {spec.backend} prices --cp-size 1 only"
        )


def extrapolated(spec: MeasuredSpec, cp_size: int, chunk_size: int, longest_context: int) -> list[str]:
    """What a run of ``cp_size`` GPUs, chunks of ``chunk_size`` tokens and prompts of up to ``longest_context``
    tokens prices past the installed measurements, one phrase each (empty when nothing is), e.g.
    ``"collectives over 16 GPUs (NCCL measured over at most 8, one node: inter-node modelled)"``."""
    out = []
    most = nccl_gpus(spec.gpu)
    if cp_size > most:
        out.append(
            f"collectives over {cp_size} GPUs (NCCL measured over at most {most}, one node: "
            "aiconfigurator models the rest)"
        )
    isl, step = dsa_models(spec.gpu, spec.backend).get(spec.model, (0, 0))
    if chunk_size > isl:
        out.append(f"attention runs of up to {chunk_size:,} query tokens (measured up to {isl:,})")
    if longest_context > isl + step:
        out.append(f"contexts of up to {longest_context:,} tokens (measured up to {isl + step:,})")
    return out
