"""What a study's requests must fit, checked before anything starts (two preflight checks).

- **Arrivals** (:func:`check_arrivals`): a Poisson scenario sends its requests at
  ``request_rate``; nothing in flight means no request deadline applies, so a tiny rate (0.001
  requests/s: 31 gaps of 1000 s on average for a run of 32) held the study for hours. A run's
  expected arrival span, ``(requests_per_run - 1) / request_rate``, must fit in
  ``bench.request_timeout_s``, the bound a run's arrivals are given
  (:func:`rayspec.bench._runner.run_bound_s` adds the requests' own deadlines to it, and the
  runner ends a run at that bound).
- **Prompt lengths** (:func:`check_prompt_lengths`): a prompt at least as long as the served
  model's context length is refused by SGLang with every request ("The input (N tokens) is
  longer than the model's context length"), and the twin spends minutes on its prefill, so
  every trial failed (``stalled_stream``) and the configurations were blamed. A prompt's
  whitespace-separated words are the twin's tokens exactly, and at most the tokens of a real
  model's tokenizer (they split text at whitespace before merging, so a token never spans two
  words); the context length is ``--context-length`` in ``server.extra_flags``, else the
  twin's own (262,144) or the target's ``config.json`` (a local folder; a hub id is not read).
"""

from __future__ import annotations

from rayspec._config import Engine
from rayspec._config import ExperimentConfig

__all__ = ["check_arrivals", "check_prompt_lengths", "served_context"]


def _hours(seconds: float) -> str:
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def check_arrivals(cfg: ExperimentConfig) -> list[str]:
    """Each Poisson scenario whose expected arrivals of one run take longer than
    ``bench.request_timeout_s``: one problem line each, naming its key."""
    problems = []
    bound = cfg.bench.request_timeout_s
    declared = [sc.name for sc in cfg.bench.scenarios]
    for sc in cfg.scenarios():
        if sc.request_rate is None or sc.requests_per_run < 2:
            continue
        span = (sc.requests_per_run - 1) / sc.request_rate
        if span <= bound:
            continue
        key = (
            f"bench.scenarios[{declared.index(sc.name)}].request_rate"
            if sc.name in declared
            else "bench.ladder.request_rate"
        )
        fastest = (sc.requests_per_run - 1) / bound
        problems.append(
            f"{key}: {sc.request_rate:g} requests/s spreads a run's {sc.requests_per_run} "
            f"arrivals (scenario {sc.name}) over {_hours(span)} on average, longer than "
            f"bench.request_timeout_s ({bound:g} s), the bound of a run's arrivals; use a rate "
            f"of at least {fastest:.3g} requests/s, fewer requests_per_run, or a longer "
            "bench.request_timeout_s"
        )
    return problems


def served_context(cfg: ExperimentConfig) -> tuple[int, str] | None:
    """The served model's context length and where it comes from (None: not known here)."""
    from rayspec.tune._node._models import _context_flag
    from rayspec.tune._node._models import read_model

    given = _context_flag(cfg.server.extra_flags)
    if given is not None:
        return given, "--context-length in server.extra_flags"
    if cfg.server.engine is Engine.twin:
        from rayspec.twin import DEFAULT_CONTEXT_LEN

        return DEFAULT_CONTEXT_LEN, "the twin's"
    target, _ = read_model("server.model_path", cfg.server.model_path)
    if target is None or target.context_len is None:
        return None
    return target.context_len, f"{cfg.server.model_path}/config.json"


def check_prompt_lengths(cfg: ExperimentConfig) -> list[str]:
    """The prompts no request can send to the served model: the longest prompt of
    ``bench.prompts`` (and each scenario's ``input_len``) against the context length."""
    from rayspec.bench import load_dataset

    found = served_context(cfg)
    if found is None:
        return []
    context, source = found
    problems = []
    scenarios = cfg.scenarios()
    declared = [sc.name for sc in cfg.bench.scenarios]
    unpadded = [sc for sc in scenarios if not sc.input_len]
    why = (
        f"the served model's context length is {context:,} tokens ({source}); SGLang refuses "
        "every request that long"
    )
    if unpadded:  # these send the set's prompts as they are
        records = load_dataset(cfg.bench.prompts)
        words, longest = max((len(r.text.split()), i) for i, r in enumerate(records))
        if words >= context:
            where = f"{cfg.bench.prompts}:{records[longest].line}"
            problems.append(
                f"bench.prompts: {where}: the prompt is {words:,} words, so at least as many "
                f"tokens, and {why}; shorten or drop it, or cut the prompts with a scenario's "
                "input_len"
            )
    for sc in scenarios:
        if sc.input_len and sc.input_len[1] >= context:
            problems.append(
                f"bench.scenarios[{declared.index(sc.name)}].input_len: up to "
                f"{sc.input_len[1]:,} words a prompt, so at least as many tokens, and {why}"
            )
    return problems
