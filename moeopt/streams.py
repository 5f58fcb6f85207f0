"""Count streams: per-step expert counts ``step_counts [L, T, E]`` whose load drifts (SPEC 12).

A *stream* is a sequence of steps (forward passes or recorder windows) that an online policy
replays: after each step it may re-plan, and the plan in service is scored on the next steps.
The bundled real data are pooled statistics (one distribution per layer, or one per domain),
so these builders turn them into streams by *count sampling*: every step and layer is a
multinomial draw of ``tokens_per_step x top_k`` token-slots from a per-step expert
distribution. The distribution is real; the per-step noise is that of a batch of
``tokens_per_step`` tokens (a multinomial over token-slots: a token's k experts are drawn as
k independent slots, slightly more variance than k distinct experts); how the distribution
moves from step to step is the builder's:

* [`domain_sequence`][moeopt.streams.domain_sequence]: domains visited in sequence (the OLMoE and Mixtral per-domain
  counts of ``instances/real/olmoe_mixtral_domain_expert_counts.npz``: allenai/OLMoE,
  ``scripts/routing_output``), optionally blending into the next domain;
* [`phase_shift`][moeopt.streams.phase_shift]: one distribution, then another from a switch step on (DeepSeek-V3
  prefill then decode loads, recorded by SGLang's expert distribution recorder: sgl-project/
  sglang issue 6017), optionally with a linear ramp;
* [`count_sampled`][moeopt.streams.count_sampled]: one distribution, stationary or drifting by a multiplicative random
  walk (e.g. on the DeepSeek-V3 loads);
* [`domain_mix`][moeopt.streams.domain_mix]: a *token trace*, not counts: each token labelled
  with its domain (its task family), the mix of domains drifting from even through mixes
  focused on each domain in turn, each token's experts drawn from its domain's distribution.

No step gives an expert more than ``tokens_per_step`` token-slots (a token picks an expert at
most once): shares above ``1 / top_k`` are capped and the excess spread over the others in
proportion ([`cap_shares`][moeopt.streams.cap_shares]), and a draw above ``tokens_per_step`` is cut to it, its excess
drawn again over the other experts ([`sample_counts`][moeopt.streams.sample_counts]). Every
builder is seeded and deterministic; the count builders return float counts that sum to
``tokens_per_step * top_k`` at every step and layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from moeopt.errors import InputError
from moeopt.schema import check_size
from moeopt.synth import group_limited_topk
from moeopt.trace import Trace


def _check_int(value: int, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(None, field, f"expected an integer >= {minimum}, found {value!r}")
    return int(value)


def _distribution(counts: np.ndarray, field: str, top_k: int) -> np.ndarray:
    """Counts ``[L, E]`` checked and normalized to per-layer shares (each row sums to 1)."""
    arr = np.asarray(counts)
    if arr.dtype.kind not in "iuf" or arr.ndim != 2 or arr.size == 0:
        raise InputError(None, field, f"expected numeric counts [layers, experts], found {arr.dtype} {list(arr.shape)}")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise InputError(None, field, "expected finite counts >= 0, found NaN, infinite or negative ones")
    if top_k > arr.shape[1]:
        raise InputError(None, "top_k", f"expected at most experts={arr.shape[1]}, found {top_k}")
    routed = (arr > 0).sum(axis=1)
    if (routed < top_k).any():
        layer = int(np.argmax(routed < top_k))
        raise InputError(None, field, f"layer {layer} routes to {int(routed[layer])} experts, fewer than top_k={top_k}")
    return np.asarray(arr / arr.sum(axis=1, keepdims=True))


def cap_shares(shares: np.ndarray, cap: float) -> np.ndarray:
    """Shares (last axis sums to 1) with none above ``cap``: the excess of each capped expert is
    spread over the uncapped ones in proportion to their shares (water-filling, vectorized over
    the leading axes; zero shares stay zero).

    Parameters
    ----------
    shares
        float ``[..., E]``, each row summing to 1, with at least ``ceil(1 / cap)`` positive
        entries per row.
    cap
        The largest share an expert may take (``1 / top_k`` for top-k routing).

    Returns
    -------
    numpy.ndarray
        The capped shares, same shape, rows still summing to 1.
    """
    p = np.array(shares, dtype=np.float64)
    for _ in range(p.shape[-1]):  # each pass caps at least one more expert
        excess = np.clip(p - cap, 0.0, None).sum(axis=-1, keepdims=True)
        if not (excess > 1e-12).any():
            break
        p = np.minimum(p, cap)
        room = np.where((p < cap) & (p > 0), p, 0.0)
        total = room.sum(axis=-1, keepdims=True)
        p = p + excess * np.divide(room, total, out=np.zeros_like(room), where=total > 0)
    return np.asarray(p / p.sum(axis=-1, keepdims=True))


def sample_counts(shares: np.ndarray, tokens_per_step: int, top_k: int, seed: int | Sequence[int] = 0) -> np.ndarray:
    """Per-step counts drawn from per-step expert shares: ``tokens_per_step * top_k``
    token-slots per step and layer, a multinomial over the (capped) shares; a count above
    ``tokens_per_step`` is cut to it and its excess drawn again over the experts below it.

    Parameters
    ----------
    shares
        float ``[L, T, E]``: expert shares of every layer and step (rows sum to 1).
    tokens_per_step
        Tokens of a step (the batch): sets the per-step noise.
    top_k
        Experts per token; no expert gets more than a ``1 / top_k`` share.
    seed
        Seed of the draw (an integer or a sequence of them, as numpy's ``default_rng``).

    Returns
    -------
    numpy.ndarray
        float ``[L, T, E]`` counts, each step and layer summing to ``tokens_per_step * top_k``.
    """
    tokens_per_step = _check_int(tokens_per_step, "tokens_per_step", 1)
    top_k = _check_int(top_k, "top_k", 1)
    rng = np.random.default_rng(seed)
    p = cap_shares(shares, 1.0 / top_k)
    counts = rng.multinomial(tokens_per_step * top_k, p)
    # an expert near the 1/k cap can still draw more slots than there are tokens: such counts
    # are cut to tokens_per_step and their excess drawn again over the experts below it
    for _ in range(p.shape[-1]):
        excess = np.clip(counts - tokens_per_step, 0, None).sum(axis=-1)
        if not excess.any():
            break
        counts = np.minimum(counts, tokens_per_step)
        room = np.where(counts < tokens_per_step, p, 0.0)
        total = room.sum(axis=-1, keepdims=True)
        room = np.where(total > 0, room / np.where(total > 0, total, 1.0), 1.0 / p.shape[-1])
        counts = counts + rng.multinomial(excess, room)
    return np.asarray(counts, dtype=np.float64)


def domain_sequence(
    counts_by_domain: Mapping[str, np.ndarray],
    order: Sequence[str],
    steps_per_domain: int,
    tokens_per_step: int,
    top_k: int,
    *,
    blend: int = 0,
    seed: int = 0,
) -> np.ndarray:
    """Domains visited in sequence: ``steps_per_domain`` steps sampled from each domain's
    expert distribution in turn.

    Provenance: built for the OLMoE-1B-7B and Mixtral-8x7B per-domain expert counts of
    ``instances/real/olmoe_mixtral_domain_expert_counts.npz`` (allenai/OLMoE, Apache-2.0,
    ``scripts/routing_output/<model>/expert_counts/<domain>``: about 205k real tokens per
    domain, layers 0, 7 and 15), read with ``format: olmoe-domains``. Each domain's
    distribution is real; the steps are count-sampled from it ([`sample_counts`][moeopt.streams.sample_counts]).

    Parameters
    ----------
    counts_by_domain
        Domain name -> counts ``[L, E]`` (token-slots routed to each expert), one shape for all.
    order
        The domains to visit, in order (a name may repeat: a return to an earlier domain).
    steps_per_domain
        Steps spent in each domain (``T = len(order) * steps_per_domain``).
    tokens_per_step
        Tokens per step (the per-step noise).
    top_k
        The model's experts per token.
    blend
        Steps of gradual shift: the last ``blend`` steps of each domain but the last move
        linearly toward the next one (step ``j = 1..blend`` of the blend puts ``j / (blend + 1)``
        of the shares on it); 0 (default) switches abruptly. At most ``steps_per_domain - 1``.
    seed
        Seed of the sample.

    Returns
    -------
    numpy.ndarray
        float ``[L, len(order) * steps_per_domain, E]`` counts; step ``i * steps_per_domain`` is
        the first of domain ``order[i]``.

    Raises
    ------
    InputError
        An unknown or empty domain list, counts of different shapes, bad sizes.
    """
    steps_per_domain = _check_int(steps_per_domain, "steps_per_domain", 1)
    blend = _check_int(blend, "blend", 0)
    top_k = _check_int(top_k, "top_k", 1)
    if not order:
        raise InputError(None, "order", "expected at least one domain")
    unknown = [d for d in order if d not in counts_by_domain]
    if unknown:
        raise InputError(None, "order", f"no domain {unknown[0]!r}; the counts hold {', '.join(counts_by_domain)}")
    if blend >= steps_per_domain:
        most = steps_per_domain - 1
        raise InputError(None, "blend", f"expected at most steps_per_domain - 1 = {most}, found {blend}")
    shares = {d: _distribution(counts_by_domain[d], f"counts_by_domain[{d!r}]", top_k) for d in dict.fromkeys(order)}
    shapes = {p.shape for p in shares.values()}
    if len(shapes) != 1:
        raise InputError(None, "counts_by_domain", f"expected one [layers, experts] shape, found {sorted(shapes)}")
    L, E = shapes.pop()
    D = len(order)
    T = D * steps_per_domain
    check_size(f"layers x steps x experts ({L} x {T} x {E})", L * T * E, None, "steps_per_domain")
    dist = np.stack([shares[d] for d in order])  # [D, L, E]
    # each step: its domain, the next one, and the next one's weight (the blend at a segment's end)
    domain = np.repeat(np.arange(D), steps_per_domain)  # [T]
    into = np.arange(T) - domain * steps_per_domain - (steps_per_domain - blend - 1)  # 1..blend inside the blend
    weight = np.where((into > 0) & (domain < D - 1), into / (blend + 1), 0.0)
    following = np.minimum(domain + 1, D - 1)
    per_step = (1.0 - weight)[:, None, None] * dist[domain] + weight[:, None, None] * dist[following]  # [T, L, E]
    return sample_counts(np.transpose(per_step, (1, 0, 2)), tokens_per_step, top_k, seed)


def phase_shift(
    a: np.ndarray,
    b: np.ndarray,
    steps: int,
    switch: int,
    tokens_per_step: int,
    top_k: int,
    *,
    ramp: int = 0,
    seed: int = 0,
) -> np.ndarray:
    """One distribution, then another from step ``switch`` on (a phase change of the traffic).

    Provenance: built for the DeepSeek-V3 prefill then decode expert loads of
    ``instances/real/deepseek_v3_prefill_in1024.json`` and
    ``deepseek_v3_decode_in1000out1000.json`` (SGLang's expert distribution recorder,
    published by the SGLang team in sgl-project/sglang issue 6017; 58 MoE layers x 256
    experts, about 8.4 M tokens x top-8 per layer). Each phase's distribution is real; the
    steps are count-sampled from it at ``tokens_per_step`` tokens (e.g. 4096 x 8 token-slots).

    Parameters
    ----------
    a, b
        Counts ``[L, E]`` before and after the switch (one shape).
    steps
        Steps of the stream, T.
    switch
        The first step drawn from ``b`` (1 .. T - 1).
    tokens_per_step
        Tokens per step (the per-step noise).
    top_k
        The model's experts per token.
    ramp
        Steps of gradual shift: steps ``switch .. switch + ramp - 1`` put ``j / (ramp + 1)``
        (``j = 1..ramp``) of the shares on ``b``, full ``b`` after; 0 (default) switches at once.
        ``switch + ramp`` is at most T.
    seed
        Seed of the sample.

    Returns
    -------
    numpy.ndarray
        float ``[L, T, E]`` counts.

    Raises
    ------
    InputError
        Shapes that differ, a switch or ramp outside the stream, bad sizes.
    """
    steps = _check_int(steps, "steps", 2)
    switch = _check_int(switch, "switch", 1)
    ramp = _check_int(ramp, "ramp", 0)
    top_k = _check_int(top_k, "top_k", 1)
    if switch >= steps:
        raise InputError(None, "switch", f"expected 1..{steps - 1} (steps - 1), found {switch}")
    if switch + ramp > steps:
        raise InputError(None, "ramp", f"expected at most steps - switch = {steps - switch}, found {ramp}")
    pa, pb = _distribution(a, "a", top_k), _distribution(b, "b", top_k)
    if pa.shape != pb.shape:
        raise InputError(None, "b", f"expected the shape of a {list(pa.shape)}, found {list(pb.shape)}")
    L, E = pa.shape
    check_size(f"layers x steps x experts ({L} x {steps} x {E})", L * steps * E, None, "steps")
    weight = np.clip((np.arange(steps) - switch + 1) / (ramp + 1), 0.0, 1.0)  # [T]: b's weight
    per_step = (1.0 - weight)[None, :, None] * pa[:, None, :] + weight[None, :, None] * pb[:, None, :]
    return sample_counts(per_step, tokens_per_step, top_k, seed)


def count_sampled(
    load: np.ndarray,
    steps: int,
    tokens_per_step: int,
    top_k: int,
    *,
    drift: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """A stream sampled from one distribution, stationary or drifting.

    Provenance: built for the DeepSeek-V3 expert loads of ``instances/real/`` (SGLang's
    expert distribution recorder, sgl-project/sglang issue 6017), or any count file. With
    ``drift > 0`` each expert's share performs a multiplicative random walk: the log-share
    offset of step t is a sum of t Gaussian steps of standard deviation ``drift`` (0 at step
    0, so step 0 follows the real loads), so nearby steps resemble each other and far ones
    less; the walk is synthetic, the starting distribution real.

    Parameters
    ----------
    load
        Counts ``[L, E]``.
    steps
        Steps of the stream, T.
    tokens_per_step
        Tokens per step (the per-step noise).
    top_k
        The model's experts per token.
    drift
        Log-scale step of the random walk (0: stationary, every step from ``load``).
    seed
        Seed of the walk and the sample.

    Returns
    -------
    numpy.ndarray
        float ``[L, T, E]`` counts.

    Raises
    ------
    InputError
        A negative or non-finite drift, bad counts or sizes.
    """
    steps = _check_int(steps, "steps", 1)
    top_k = _check_int(top_k, "top_k", 1)
    if not (isinstance(drift, (int, float, np.floating)) and np.isfinite(drift) and drift >= 0):
        raise InputError(None, "drift", f"expected a finite number >= 0, found {drift!r}")
    p = _distribution(load, "load", top_k)
    L, E = p.shape
    check_size(f"layers x steps x experts ({L} x {steps} x {E})", L * steps * E, None, "steps")
    walk = np.cumsum(np.random.default_rng([seed, 1]).normal(0.0, float(drift), size=(L, steps, E)), axis=1)
    walk -= walk[:, :1]  # step 0 is the real distribution
    per_step = p[:, None, :] * np.exp(walk - walk.max(axis=2, keepdims=True))
    per_step /= per_step.sum(axis=2, keepdims=True)
    return sample_counts(per_step, tokens_per_step, top_k, [seed, 2])


#: ``domain_mix``: the focused domain's share at each waypoint (the rest spread evenly)
DEFAULT_FOCUS = 0.85


def mix_waypoints(domains: int, steps: int, focus: float = DEFAULT_FOCUS) -> np.ndarray:
    """float ``[steps, domains]``: each step's domain mix, moving linearly between waypoints
    spaced evenly from the first step to the last: the even mix, then a mix with ``focus`` of
    the tokens on each domain in turn (the rest spread evenly over the others)."""
    D = domains
    even = np.full(D, 1.0 / D)
    rest = (1.0 - focus) / (D - 1) if D > 1 else 0.0
    way = np.vstack([even] + [np.where(np.arange(D) == d, focus, rest) for d in range(D)])
    pos = np.linspace(0.0, len(way) - 1.0, steps)
    lo = np.minimum(np.floor(pos).astype(np.int64), len(way) - 2)
    frac = (pos - lo)[:, None]
    return np.asarray((1.0 - frac) * way[lo] + frac * way[lo + 1])


def domain_mix(
    counts_by_domain: Mapping[str, np.ndarray],
    order: Sequence[str],
    steps: int,
    tokens_per_step: int,
    top_k: int,
    *,
    focus: float = DEFAULT_FOCUS,
    seed: int = 0,
) -> Trace:
    """A token trace whose mix of domains drifts: every token labelled with its domain (its task
    family), the mix moving from even through mixes focused on each domain in turn.

    Provenance: built for the OLMoE-1B-7B and Mixtral-8x7B per-domain expert counts of
    ``instances/real/olmoe_mixtral_domain_expert_counts.npz`` (allenai/OLMoE), as
    [`domain_sequence`][moeopt.streams.domain_sequence]. Each domain's distribution is real;
    the mix over time ([`mix_waypoints`][moeopt.streams.mix_waypoints]) and the tokens are
    drawn: step ``t`` holds ``tokens_per_step`` tokens whose domains are a multinomial draw
    from its mix, and each token picks ``top_k`` distinct experts per layer by Gumbel top-k on
    the log shares of its domain (Plackett-Luce sampling, which keeps the hottest experts
    hottest). Experts are drawn independently across tokens (no coactivation beyond the
    domain's marginals): label results on it *count-sampled*.

    Parameters
    ----------
    counts_by_domain
        Domain name -> counts ``[L, E]``, one shape for all.
    order
        The domains, in the order the mix focuses on them (each at most once, at least two).
    steps
        Steps of the trace.
    tokens_per_step
        Tokens per step.
    top_k
        The model's experts per token.
    focus
        The focused domain's share at its waypoint (``1 / len(order) < focus <= 1``).
    seed
        Seed of the draw.

    Returns
    -------
    Trace
        ``steps * tokens_per_step`` tokens, ``family`` the index of the token's domain in
        ``order``, ``step`` in ``0 .. steps - 1``.

    Raises
    ------
    InputError
        Unknown, repeated or fewer than two domains, counts of different shapes, a focus out of
        range, bad sizes.
    """
    steps = _check_int(steps, "steps", 1)
    tokens_per_step = _check_int(tokens_per_step, "tokens_per_step", 1)
    top_k = _check_int(top_k, "top_k", 1)
    if len(order) < 2:
        raise InputError(None, "order", f"expected at least two domains to mix, found {len(order)}")
    unknown = [d for d in order if d not in counts_by_domain]
    if unknown:
        raise InputError(None, "order", f"no domain {unknown[0]!r}; the counts hold {', '.join(counts_by_domain)}")
    if len(set(order)) != len(order):
        raise InputError(None, "order", "expected each domain once (the mix focuses on each in turn)")
    D = len(order)
    if not (isinstance(focus, (int, float, np.floating)) and 1.0 / D < focus <= 1.0):
        raise InputError(None, "focus", f"expected a share above 1/{D} and at most 1, found {focus!r}")
    dist = [_distribution(counts_by_domain[d], f"counts_by_domain[{d!r}]", top_k) for d in order]
    shapes = {p.shape for p in dist}
    if len(shapes) != 1:
        raise InputError(None, "counts_by_domain", f"expected one [layers, experts] shape, found {sorted(shapes)}")
    L, E = shapes.pop()
    N = steps * tokens_per_step
    check_size(f"tokens x layers x top_k ({N} x {L} x {top_k})", N * L * top_k, None, "tokens_per_step")
    rng = np.random.default_rng(seed)
    per_step = rng.multinomial(tokens_per_step, mix_waypoints(D, steps, float(focus)))  # [T, D] tokens
    family = np.repeat(np.tile(np.arange(D), steps), per_step.ravel()).astype(np.int32)
    step = np.repeat(np.arange(steps), tokens_per_step).astype(np.int32)
    with np.errstate(divide="ignore"):
        logp = np.log(np.stack(dist))  # [D, L, E]; an expert never routed (-inf) is never picked
    topk = np.empty((N, L, top_k), dtype=np.int16 if E < 2**15 else np.int32)
    for l in range(L):
        topk[:, l, :] = group_limited_topk(logp[family, l] + rng.gumbel(size=(N, E)), top_k)
    return Trace(topk=topk, family=family, step=step, family_names=tuple(order), num_experts=E)
