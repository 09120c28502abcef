"""``cpkv simulate``'s settings as data (``SETTINGS``, one table), and the replay they make: the workload
(``workload_of``), the ``SimConfig`` (``config_of``) and its cost model (``measured_spec``).

``cli/simulate.py`` builds its click options from the table, and ``cpkv sweep`` takes its grid keys,
defaults and value conversion from it (``sweep/grid.py``, ``points.py``, ``point.py``): a setting added here
is a flag and a grid key. Each setting belongs to one group: ``workload`` (which requests), ``config`` (a
``SimConfig`` field of the same name), ``cost`` (``SimConfig.measured``) or ``selector`` (which replays run:
``--policy``, ``--kv-storage``, ``--cp-strategy``, repeatable, ``all`` expanded by ``validate.expand_all``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import CP_STRATEGIES, OWNER_POLICIES, ZIGZAG
from ..cost.spec import DEFAULT_BACKEND, DEFAULT_GPU, DEFAULT_MODEL, MeasuredSpec
from ..errors import InputError
from ..validate import EMPTY_PATH, check_int, parse_pages_per_lane
from .config import KV_STORAGE_DESIGNS, OWNER_LANE, SimConfig

WORKLOAD, CONFIG, COST, SELECTOR = "workload", "config", "cost", "selector"
"""The groups of ``SETTINGS``: the requests, a ``SimConfig`` field, the cost model, which replays run."""

TYPE_NAMES = {int: "integer", float: "float", bool: "boolean", str: "text", Path: "path"}
"""What a value of each kind is called in messages (click's names: ``'a' is not a valid float``)."""


@dataclass(frozen=True)
class Setting:
    """One setting of ``cpkv simulate``.

    Attributes:
        name: the parameter's name, the key of an options dict (``policies``).
        flag: the long flag (``--policy``); ``key`` (``policy``) names it in a sweep's grid.
        kind: ``int``, ``float``, ``bool`` (a flag: given or not), ``str`` or ``Path``.
        default: the value when not given (None: the workload's or ``SimConfig``'s, resolved later).
        help: the ``--help`` text. group: ``WORKLOAD``, ``CONFIG``, ``COST`` or ``SELECTOR``.
        choices: the values a ``str`` setting accepts, or None for any.
        multiple: repeatable (a tuple of values). show_default: ``--help`` shows the default.
        parse: turns the text into the value (``--pages-per-lane``: ``validate.parse_pages_per_lane``);
            InputError for text it refuses.
    """

    name: str
    flag: str
    kind: type
    default: object
    help: str
    group: str
    choices: tuple[str, ...] | None = None
    multiple: bool = False
    show_default: bool = False
    parse: Callable[[str | None], object] | None = None

    @property
    def key(self) -> str:
        """The setting's grid key, its flag's name: ``--cp-size`` -> ``cp_size``, ``--policy`` -> ``policy``."""
        return self.flag[2:].replace("-", "_")

    @property
    def type_name(self) -> str:
        """``choice`` for a setting with ``choices``, else its kind's name (``TYPE_NAMES``)."""
        return "choice" if self.choices is not None else TYPE_NAMES[self.kind]

    def convert(self, value: object) -> object:
        """One value as the flag takes it (a repeatable setting's one item): a number of the kind (``2`` ->
        ``2.0`` for a float), a choice by name, text through ``parse`` (``"2048"`` -> 2048).

        Raises:
            InputError: a value the setting refuses, in click's words (``'x' is not one of 'zigzag',
                'interleave', 'all'.``, ``'a' is not a valid float.``) or ``parse``'s.
        """
        if self.choices is not None:
            if str(value) not in self.choices:
                listed = ", ".join(map(repr, self.choices))
                one = f"one of {listed}" if len(self.choices) > 1 else listed
                raise InputError(f"{value!r} is not {one}.")
            return str(value)
        if self.kind in (int, float):
            try:
                value = self.kind(value)  # type: ignore[call-overload,arg-type]
            except (TypeError, ValueError):
                raise InputError(f"{value!r} is not a valid {self.type_name}.") from None
        elif self.kind is bool and not isinstance(value, bool):
            raise InputError(f"{value!r} is not a valid {self.type_name}.")
        elif self.kind is str:
            value = str(value)
        elif self.kind is Path:
            if value == "":  # Path("") is ".", the current directory
                raise InputError(EMPTY_PATH)
            value = Path(value)  # type: ignore[arg-type]
        return self.parse(value) if self.parse is not None else value  # type: ignore[arg-type]


SETTINGS = (
    Setting("trace", "--trace", Path, None, "Mooncake-format JSONL trace.", WORKLOAD),
    Setting(
        "workload",
        "--workload",
        str,
        None,
        "Built-in workload when no --trace is given (default: synthetic).",
        WORKLOAD,
        choices=("synthetic", "tiny-chunks", "tiny-chunks-reload", "short-prompts"),
    ),
    Setting(
        "cp_size",
        "--cp-size",
        int,
        SimConfig.cp_size,
        "Ranks in the CP group (C), at most 4096 (cpkv.limits.MAX_CP_SIZE).",
        CONFIG,
        show_default=True,
    ),
    Setting(
        "page_size",
        "--page-size",
        int,
        SimConfig.page_size,
        "Tokens per KV page (P).",
        CONFIG,
        show_default=True,
    ),
    Setting(
        "pages_per_lane",
        "--pages-per-lane",
        str,
        None,
        f"Device pages per lane: N, or one per lane as 9,10,10,10 (ranks with unequal free memory), or "
        f"auto [auto: what one GPU holds under --cost-model measured (aiconfigurator's KV-cache "
        f"estimator, docs/cost-model.md), {SimConfig.pages_per_lane} under illustrative; the lane-skew "
        f"workloads size their own pool, docs/metrics.md].",
        CONFIG,
        parse=parse_pages_per_lane,
    ),
    Setting(
        "host_pages_per_lane",
        "--host-pages-per-lane",
        int,
        None,
        f"Host-tier pages per lane [{SimConfig.host_pages_per_lane}; tiny-chunks-reload: enough for every "
        "prompt page].",
        CONFIG,
    ),
    Setting(
        "chunk_size",
        "--chunk-size",
        int,
        None,
        f"Most tokens a request prefills per step [{SimConfig.chunk_size}].",
        CONFIG,
    ),
    Setting(
        "max_batch_tokens",
        "--max-batch-tokens",
        int,
        None,
        f"Most prefill tokens per step [max(2 x chunk size, {SimConfig.max_batch_tokens})].",
        CONFIG,
    ),
    Setting(
        "logits_budget_mb",
        "--logits-budget-mb",
        float,
        SimConfig.logits_budget_mb,
        "MQA-logits buffer budget per rank in MiB (0: off).",
        CONFIG,
        show_default=True,
    ),
    Setting(
        "colocated_decode",
        "--colocated-decode",
        bool,
        False,
        "Keep pages for output_length decode steps.",
        CONFIG,
    ),
    Setting(
        "spec_draft_tokens",
        "--spec-draft-tokens",
        int,
        SimConfig.spec_draft_tokens,
        "MTP decode: KV slots per request per step (root + K-1 drafts; alloc_draft, release_tail). "
        "Implies --colocated-decode; 0: plain decode.",
        CONFIG,
        show_default=True,
    ),
    Setting(
        "spec_accept_rate",
        "--spec-accept-rate",
        float,
        SimConfig.spec_accept_rate,
        "Per-draft-token acceptance probability of --spec-draft-tokens (seeded, geometric).",
        CONFIG,
        show_default=True,
    ),
    Setting(
        "policies",
        "--policy",
        str,
        ("all",),
        "Owner policy; repeatable.",
        SELECTOR,
        choices=(*OWNER_POLICIES, "all"),
        multiple=True,
        show_default=True,
    ),
    Setting(
        "kv_storage",
        "--kv-storage",
        str,
        (OWNER_LANE,),
        "KV storage design (SPEC C-STORAGE, docs/storage-models.md); repeatable. Owner policies place "
        "owner-lane's pages; the other designs run once each with their own placement.",
        SELECTOR,
        choices=(*KV_STORAGE_DESIGNS, "all"),
        multiple=True,
        show_default=True,
    ),
    Setting(
        "cp_strategies",
        "--cp-strategy",
        str,
        (ZIGZAG,),
        "CP strategy (SPEC C-ZIGZAG, C-INTERLEAVE): how a request's new pages go to the ranks that own "
        "and compute them; repeatable. Every design and policy runs under each.",
        SELECTOR,
        choices=(*CP_STRATEGIES, "all"),
        multiple=True,
        show_default=True,
    ),
    Setting(
        "cost_model",
        "--cost-model",
        str,
        "measured",
        "What prices each step: aiconfigurator's measured operator latencies (the `cost` extra) "
        "or three illustrative constants (not a GPU's).",
        COST,
        choices=("measured", "illustrative"),
        show_default=True,
    ),
    Setting("gpu", "--gpu", str, None, f"Measured: aiconfigurator system [{DEFAULT_GPU}].", COST),
    Setting(
        "model",
        "--model",
        str,
        None,
        f"Measured: DeepSeek sparse-attention model the installed aiconfigurator "
        f"data holds, e.g. zai-org/GLM-5 [{DEFAULT_MODEL}].",
        COST,
    ),
    Setting(
        "backend",
        "--backend",
        str,
        None,
        f"Measured: engine whose kernels were timed [{DEFAULT_BACKEND}].",
        COST,
        choices=("sglang", "vllm", "trtllm"),
    ),
    Setting(
        "ep_size",
        "--ep-size",
        int,
        None,
        "Measured: MoE expert-parallel GPUs, a divisor of --cp-size [--cp-size]; attention runs one "
        "rank per GPU (SGLang CP has no attention TP, so there is no --tp-size).",
        COST,
    ),
    Setting(
        "ttft_slo_ms",
        "--ttft-slo-ms",
        float,
        None,
        "TTFT objective in ms: the report adds slo_attainment, the share of all requests (unfinished "
        "ones miss it) whose TTFT is at most this [off].",
        CONFIG,
    ),
    Setting(
        "max_requests",
        "--max-requests",
        int,
        None,
        "Replay only the first N requests (of the window).",
        WORKLOAD,
    ),
    Setting(
        "start",
        "--start",
        float,
        None,
        "Replay the requests arriving from this many seconds into the workload (shifted to 0) [0].",
        WORKLOAD,
    ),
    Setting(
        "duration",
        "--duration",
        float,
        None,
        "Replay the requests arriving within this many seconds of --start [to the end].",
        WORKLOAD,
    ),
    Setting(
        "rate_scale",
        "--rate-scale",
        float,
        None,
        "Compress the arrivals by X (2: twice the traffic, the same requests in half the time) [1].",
        WORKLOAD,
    ),
    Setting(
        "seed", "--seed", int, SimConfig.seed, "Seed of the built-in workloads.", CONFIG, show_default=True
    ),
)
"""Every setting of ``cpkv simulate``, in ``--help`` order (also the order of a sweep's config columns)."""


def by_key() -> dict[str, Setting]:
    """``SETTINGS`` by grid key (``Setting.key``: ``--policy`` -> ``policy``), in table order."""
    return {s.key: s for s in SETTINGS}


def defaults() -> dict[str, object]:
    """``{name: default}`` of every setting: the options of a ``cpkv simulate`` given no flag."""
    return {s.name: s.default for s in SETTINGS}


def names(group: str) -> tuple[str, ...]:
    """The names of ``group``'s settings, in table order (``names(COST)``: ``cost_model``, ``gpu``, ...)."""
    return tuple(s.name for s in SETTINGS if s.group == group)


WORKLOAD_OPTIONS = names(WORKLOAD)
"""Settings that choose the requests (``workload_of``; ``seed`` and ``page_size`` shape the generated ones
too): ``trace``, ``workload``, ``max_requests``, ``start``, ``duration``, ``rate_scale``."""
WINDOW_OPTIONS = ("start", "duration", "rate_scale")
"""The traffic window (``sim.window.traffic_window``), applied before ``max_requests``."""
COST_OPTIONS = names(COST)
"""Settings that make ``SimConfig.measured`` (``measured_spec``, in its argument order)."""
POLICY_OPTION = "policies"
"""``--policy`` (repeatable): which replays to run, not part of the ``SimConfig``."""
STORAGE_OPTION = "kv_storage"
"""``--kv-storage`` (repeatable): which KV storage designs to replay, not part of the ``SimConfig``."""
STRATEGY_OPTION = "cp_strategies"
"""``--cp-strategy`` (repeatable): which CP strategies to replay; ``config_of`` puts the first into
``SimConfig.cp_strategy`` (a sweep point has one)."""


def check_workload_options(options: dict) -> None:
    """InputError for ``--trace`` with ``--workload``, or a ``--max-requests`` below 1."""
    if options["trace"] is not None and options["workload"] is not None:
        raise InputError(f"give --trace or --workload, not both (got --workload {options['workload']})")
    if options["max_requests"] is not None:
        check_int(
            "--max-requests", options["max_requests"], 1
        )  # named as given (the workloads: num_requests)


def workload_of(options: dict):
    """The ``WorkloadSpec`` that ``options`` (settings by name) name: the trace, or the built-in workload
    (default ``synthetic``), cut to the traffic window (``--start``, ``--duration``, ``--rate-scale``;
    ``sim.window.traffic_window``), its first ``max_requests``.

    Raises: InputError (``check_workload_options``), ConfigError, TraceError (``build_workload``)."""
    from dataclasses import replace

    from .window import traffic_window
    from .workload import build_workload

    check_workload_options(options)
    trace = options["trace"]
    name = "trace" if trace is not None else options["workload"] or "synthetic"
    window = [options.get(k) for k in WINDOW_OPTIONS]
    cap = options["max_requests"]
    spec = build_workload(
        name,
        num_requests=None if trace is not None and any(v is not None for v in window) else cap,
        seed=options["seed"],
        trace_path=trace,
        page_size=options["page_size"],
    )
    spec = traffic_window(spec, *window)
    if cap is not None and len(spec.requests) > cap:
        spec = replace(spec, requests=spec.requests[:cap])
    return spec


def config_of(options: dict, spec) -> SimConfig:
    """The ``SimConfig`` of ``options`` (settings by name) for the workload ``spec``: every ``CONFIG``
    setting as given (None: the workload's or the default, ``SimConfig.for_workload``), the ``COST``
    settings make ``measured`` (``measured_spec``), the first ``--cp-strategy`` (``all``: zigzag) makes
    ``cp_strategy``.

    Raises: InputError (a measured-only flag with the illustrative model), ConfigError, CostModelError.
    """
    fields = {f.name for f in dataclasses.fields(SimConfig)}
    settings = {k: v for k, v in options.items() if k in fields}
    strategies = options.get(STRATEGY_OPTION) or (ZIGZAG,)
    settings["cp_strategy"] = CP_STRATEGIES[0] if strategies[0] == "all" else strategies[0]
    measured = measured_spec(*(options[k] for k in COST_OPTIONS))
    return SimConfig.for_workload(spec, **settings, measured=measured)


def measured_spec(cost_model: str, gpu, model, backend, ep_size) -> MeasuredSpec | None:
    """The ``MeasuredSpec`` of the cost settings (defaults for the names not given), or None for the
    illustrative model; InputError for a measured-only flag given with ``--cost-model illustrative``."""
    given = {"--gpu": gpu, "--model": model, "--backend": backend, "--ep-size": ep_size}
    if cost_model == "illustrative":
        extra = [flag for flag, v in given.items() if v is not None]
        if extra:
            verb, them = ("applies", "it") if len(extra) == 1 else ("apply", "them")
            raise InputError(
                f"{', '.join(extra)} {verb} only to --cost-model measured: drop {them} or use "
                "--cost-model measured"
            )
        return None
    return MeasuredSpec(
        gpu=gpu or DEFAULT_GPU,
        model=model or DEFAULT_MODEL,
        backend=backend or DEFAULT_BACKEND,
        ep_size=ep_size,
    )
