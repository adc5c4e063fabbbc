"""What a benchmark sends: scenarios and the plan around them (pure, validated at construction)."""

from __future__ import annotations

import dataclasses
import math

from rayspec._exceptions import ConfigError

_ENDPOINTS = ("generate", "completions", "chat")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One load shape, measured ``BenchPlan.repeats`` times.

    Attributes:
        name: label stored in every :class:`~rayspec.RequestRecord` of this scenario.
        concurrency: requests in flight at once (closed loop: a finished request makes room for
            the next one).
        requests_per_run: requests sent in one run.
        max_tokens: ``max_new_tokens`` of every request (with ``ignore_eos`` the exact output
            length), unless ``output_len_range`` is set or the prompt's record gives its own
            (``output_tokens``).
        prompt_set: a built-in prompt set name (``"default"``) or a path to a JSONL file.
        input_len_range: optional ``(low, high)`` prompt length in words; each request's prompt
            is padded or cut to a length drawn uniformly (deterministically) from the range.
        output_len_range: optional ``(low, high)``: each request's ``max_new_tokens`` is drawn
            uniformly (deterministically) from the range instead of ``max_tokens``.
        request_rate: None for a pure closed loop; otherwise requests arrive as a Poisson
            process of this rate (requests/s), still capped at ``concurrency`` in flight.
        seed: varies the prompt selection and the random draws of this scenario.
    """

    name: str
    concurrency: int = 1
    requests_per_run: int = 1
    max_tokens: int = 500
    prompt_set: str = "default"
    input_len_range: tuple[int, int] | None = None
    output_len_range: tuple[int, int] | None = None
    request_rate: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("Scenario.name must be a non-empty string")
        for key in ("concurrency", "requests_per_run", "max_tokens"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Scenario.{key}={value!r}: expected an integer >= 1")
        for key in ("input_len_range", "output_len_range"):
            rng = getattr(self, key)
            if rng is None:
                continue
            rng = tuple(rng)
            if (
                len(rng) != 2
                or not all(isinstance(v, int) for v in rng)
                or not 1 <= rng[0] <= rng[1]
            ):
                raise ConfigError(
                    f"Scenario.{key}={rng!r}: expected (low, high) integers with 1 <= low <= high"
                )
            object.__setattr__(self, key, (int(rng[0]), int(rng[1])))
        if self.request_rate is not None and not (
            math.isfinite(self.request_rate) and self.request_rate > 0
        ):
            raise ConfigError(
                f"Scenario.request_rate={self.request_rate!r}: expected a positive number of "
                "requests/s, or None for a closed loop"
            )


@dataclasses.dataclass(frozen=True)
class BenchPlan:
    """How a trial is measured: scenarios, warm-up, repeats and client settings.

    The default is the field protocol: one warm-up request, then 5 runs of one request with
    ``max_tokens=500`` at concurrency 1, greedy, cache flushed before each scenario.

    Attributes:
        scenarios: measured one after another, in order.
        warmup: warm-up requests per scenario (``run == -1`` in the records), sent after the
            flush; they never count in statistics. At concurrency > 1 the warm-up sends at
            least ``concurrency`` requests at that concurrency (when ``warmup > 0``), so every
            connection of the pool is open and the server has run that batch size before the
            first measured run (otherwise connection set-up skews the first run's start).
        repeats: measured runs per scenario.
        first_run: the run index of the first measured run (an extension of a trial's runs on
            the same server continues the numbering, and with it the prompt sequence).
        endpoint: ``"generate"`` (SGLang's native ``/generate``, cumulative chunks),
            ``"completions"`` (``/v1/completions``, delta chunks plus usage) or ``"chat"``
            (``/v1/chat/completions``: the prompt as one user message, delta chunks plus usage).
        clock: ``"wall"`` (the client's clock; always for a real server) or ``"twin"``: a
            twin study's requests are timed by the twin's simulated clock
            (``meta_info.rayspec_twin``), at every load, so what a twin study measures is the
            modelled server's, not the host's (see :class:`~rayspec.bench.StreamClient`).
        send_category: send each request's prompt category as ``rayspec_category`` (the
            twin's own field; only when the server is the twin).
        temperature: sampling temperature (0.0 = greedy, as SGLang's own benchmarks).
        read_timeout_s: the longest gap allowed between two chunks of a stream; a longer gap
            is a stalled stream.
        request_timeout_s: deadline for one whole request, and the bound of a Poisson run's
            arrivals: ``(requests_per_run - 1) / request_rate`` must not be longer (a run's
            wall time is bounded by its arrivals, then this per request on each stream).
        flush_cache: POST ``/flush_cache`` before each scenario's warm-up (resets the radix
            cache and SGLang's speculative counters).
        flush_between_runs: also flush before every measured run (no prefix-cache reuse from
            the previous run; costs one idle round trip per run).
        ignore_eos: ask for exactly ``max_new_tokens`` tokens.
        model: the ``model`` field of ``/v1/completions`` requests.
        stop_on_error: stop after the first run in which a request failed (a crashed or stalled
            server makes every later request fail too); the records so far are returned.
        cpu_warn_fraction: a run whose client used more than this fraction of one core is
            flagged as client-bound.

    Example:
        >>> plan = BenchPlan()
        >>> plan.scenarios[0].max_tokens, plan.repeats
        (500, 5)
    """

    scenarios: tuple[Scenario, ...] = (Scenario(name="c1"),)
    warmup: int = 1
    repeats: int = 5
    first_run: int = 0
    endpoint: str = "generate"
    clock: str = "wall"
    send_category: bool = False
    temperature: float = 0.0
    read_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    flush_cache: bool = True
    flush_between_runs: bool = False
    ignore_eos: bool = True
    model: str = "default"
    stop_on_error: bool = True
    cpu_warn_fraction: float = 0.7

    def __post_init__(self) -> None:
        scenarios = tuple(self.scenarios)
        if not scenarios or not all(isinstance(s, Scenario) for s in scenarios):
            raise ConfigError("BenchPlan.scenarios must be a non-empty sequence of Scenario")
        names = [s.name for s in scenarios]
        if len(set(names)) != len(names):
            raise ConfigError(f"BenchPlan.scenarios: duplicate scenario names in {names}")
        object.__setattr__(self, "scenarios", scenarios)
        if self.warmup < 0:
            raise ConfigError(f"BenchPlan.warmup={self.warmup!r}: expected an integer >= 0")
        if self.repeats < 1:
            raise ConfigError(f"BenchPlan.repeats={self.repeats!r}: expected an integer >= 1")
        if self.first_run < 0:
            raise ConfigError(f"BenchPlan.first_run={self.first_run!r}: expected >= 0")
        if self.endpoint not in _ENDPOINTS:
            raise ConfigError(
                f"BenchPlan.endpoint={self.endpoint!r}: expected one of {', '.join(_ENDPOINTS)}"
            )
        if self.clock not in ("wall", "twin"):
            raise ConfigError(f"BenchPlan.clock={self.clock!r}: expected 'wall' or 'twin'")
        if self.clock == "twin" and self.endpoint != "generate":
            raise ConfigError(
                "BenchPlan.clock='twin' reads /generate's meta_info: expected endpoint='generate'"
            )
        if not self.temperature >= 0:
            raise ConfigError(f"BenchPlan.temperature={self.temperature!r}: expected >= 0")
        for key in ("read_timeout_s", "request_timeout_s"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and value > 0):
                raise ConfigError(f"BenchPlan.{key}={value!r}: expected a positive number of s")
        for sc in scenarios:  # a Poisson run's arrivals must fit the bound they are given
            if sc.request_rate is not None and (sc.requests_per_run - 1) / sc.request_rate > (
                self.request_timeout_s
            ):
                raise ConfigError(
                    f"Scenario {sc.name!r}: request_rate={sc.request_rate:g} spreads a run's "
                    f"{sc.requests_per_run} arrivals over "
                    f"{(sc.requests_per_run - 1) / sc.request_rate:.0f} s on average, longer "
                    f"than BenchPlan.request_timeout_s ({self.request_timeout_s:g} s)"
                )
        if not 0 < self.cpu_warn_fraction <= 1:
            raise ConfigError(
                f"BenchPlan.cpu_warn_fraction={self.cpu_warn_fraction!r}: expected (0, 1]"
            )
