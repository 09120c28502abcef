"""What the measured cost model prices, and its errors (SPEC C-COST). Light: imports no aiconfigurator."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CpkvError

DEFAULT_GPU = "h200_sxm"
DEFAULT_MODEL = "deepseek-ai/DeepSeek-V3.2"
DEFAULT_BACKEND = "sglang"
EXTRA = "cost"
"""The optional dependency group that installs aiconfigurator (``pip install '.[cost]'`` in a cpkv checkout)."""


class CostModelError(CpkvError, ValueError):
    """The measured cost model cannot price this configuration: an unknown GPU, model or engine, a model
    whose operators cpkv cannot compose, parallel sizes aiconfigurator has no measurement for. The message
    names the value and, where it came from aiconfigurator, its own words."""


class CostExtraMissing(CostModelError):
    """The measured cost model was asked for but aiconfigurator is not installed (the ``cost`` extra)."""


@dataclass(frozen=True, kw_only=True)
class MeasuredSpec:
    """Which measurements price a step (SPEC C-COST): aiconfigurator's system, model and engine.

    Attributes:
        gpu: aiconfigurator system name, e.g. ``h200_sxm``, ``b200_sxm``.
        model: Hugging Face model path aiconfigurator knows, of the DeepSeek sparse-attention (DSA) family
            (``deepseek-ai/DeepSeek-V3.2``, ``zai-org/GLM-5``).
        backend: engine whose measured kernels are used: ``sglang``, ``vllm`` or ``trtllm``.
        ep_size: MoE expert-parallel width inside the CP group; ``None`` (default) is every rank of the
            group (``cp_size``), as SGLang deploys V3.2 prefill CP. It must divide ``cp_size``; the MoE's
            tensor-parallel width is ``cp_size / ep_size``.

    Raises:
        CostModelError: an empty name or an ``ep_size`` below 1.
    """

    gpu: str = DEFAULT_GPU
    model: str = DEFAULT_MODEL
    backend: str = DEFAULT_BACKEND
    ep_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("gpu", "model", "backend"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise CostModelError(f"{name} must be a non-empty name, got {value!r}")
        ep = self.ep_size
        if ep is not None and (isinstance(ep, bool) or not isinstance(ep, int) or ep < 1):
            raise CostModelError(f"ep_size must be an int >= 1 or None (every rank), got {ep!r}")

    def ep_for(self, cp_size: int) -> int:
        """The expert-parallel width for a group of ``cp_size`` ranks; CostModelError unless it divides it."""
        ep = cp_size if self.ep_size is None else self.ep_size
        if cp_size % ep:
            raise CostModelError(
                f"ep_size {ep} must divide cp_size {cp_size} (MoE width = the CP group's GPUs)"
            )
        return ep
