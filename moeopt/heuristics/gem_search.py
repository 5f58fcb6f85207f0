"""GEM mapping search for one layer: noisy initial mappings, then pairwise swaps (SPEC 5.3).

The score is the straggler latency ``S(M) = sum_t max_g C_g(n_g(M, t))``. Free slots are
modelled as zero-load *dummy* experts, so a swap with a dummy is a move into a free slot and
every state fills all ``G * slots`` slots. The gain of every swap is evaluated at once with
numpy: a swap of experts i (on GPU a) and j (on GPU b) changes only GPUs a and b, so the new
step maximum is ``max(C_a(X_a + d), C_b(X_b - d), max_{g != a, b} C_g(X_g))`` with
``d = n_j - n_i``; the last term comes from the three largest latencies of each step. Only
swaps touching a *critical* GPU (at the maximum in some step) can lower S, so ``i`` ranges
over the experts on critical GPUs and ``j`` over all experts.

Step functions have plateaus; a swap that keeps S and lowers the speed-weighted quadratic
load ``Phi = sum_t sum_g X_tg^2 / speed_g`` (minimal when loads are proportional to speed)
is accepted as a tie-breaker, a bounded number of times in a row, so the search keeps
moving toward the balance that lets later swaps lower S. The descent stops when no swap
lowers (S, Phi) lexicographically; iterated local search then perturbs the best mapping
with random swaps and descends again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from moeopt.moves.driver import iterate
from moeopt.packing import balanced_homes
from moeopt.profile import Profile
from moeopt.utilization import ExpertClasses, classify_experts

#: Pair evaluations per chunk ([T, rows, E'] arrays) to bound memory.
_CHUNK = 2_000_000


@dataclass
class SearchStats:
    """What one layer's search did."""

    initial: list[float] = field(default_factory=list)  # S of each initial mapping
    descended: list[float] = field(default_factory=list)  # S after descending from each
    moves: int = 0
    plateau_moves: int = 0
    rounds: int = 0
    improvements: int = 0
    time: float = 0.0
    capped: bool = False  # the time limit (not rounds or patience) ended the search


class LayerSearch:
    """Straggler-latency local search for one layer.

    Parameters
    ----------
    n
        float ``[T, E]`` utilization trace of the layer.
    profile
        Latency profile with G GPUs.
    slots
        Expert slots per GPU (``G * slots >= E``).
    """

    def __init__(self, n: np.ndarray, profile: Profile, slots: int) -> None:
        n = np.asarray(n, dtype=np.float64)
        T, E = n.shape
        G = profile.gpus
        if G * slots < E:
            raise ValueError(f"{G} GPUs x {slots} slots cannot hold {E} experts")
        self.experts = E
        self.gpus = G
        self.slots = slots
        self.tile = profile.tile
        self.size = G * slots  # experts plus dummies
        self.n = np.concatenate([n, np.zeros((T, self.size - E))], axis=1)
        J = max(int(np.ceil(n.sum(axis=1).max(initial=0) / profile.tile - 1e-9)), 1)
        self.table = profile.table(J)  # [G, J + 1]
        self.J = J
        self.speed = profile.speed
        self.scale = max(float(self.table.max()), 1e-12)
        # integral counts: a per-token lookup C_g(x) replaces ceil + gather in the gains
        total = int(np.ceil(n.sum(axis=1).max(initial=0)))
        self.integral = bool(np.array_equal(n, np.round(n))) and (total + 1) * G <= 4_000_000
        if self.integral:
            self.width = total + 1
            self.lookup = profile(np.arange(total + 1)[:, None] * np.ones((1, G))).T.ravel()  # [G * (N + 1)]
            self.n_int = np.round(self.n).astype(np.int32)

    # ------------------------------------------------------------------ evaluation
    def tiles(self, x: np.ndarray) -> np.ndarray:
        return np.ceil(x / self.tile - 1e-9).astype(np.int64).clip(0, self.J)

    def latency(self, x: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        """``C_gpu(x)`` elementwise (``gpu`` broadcast against ``x``)."""
        return self.table[gpu, self.tiles(x)]

    def loads(self, home: np.ndarray) -> np.ndarray:
        """float ``[T, G]``: tokens per GPU per step."""
        onehot = np.zeros((self.size, self.gpus))
        onehot[np.arange(self.size), home] = 1.0
        return self.n @ onehot

    def score(self, home: np.ndarray) -> float:
        """S(M) of a (padded) home vector."""
        X = self.loads(home)
        return float(self.latency(X, np.arange(self.gpus)[None, :]).max(axis=1).sum())

    def pad(self, home: np.ndarray) -> np.ndarray:
        """Append dummies filling each GPU's free slots to a home vector of the real experts."""
        home = np.asarray(home, dtype=np.int64)
        free = self.slots - np.bincount(home, minlength=self.gpus)
        if (free < 0).any():
            raise ValueError("home vector exceeds slot capacity")
        return np.concatenate([home, np.repeat(np.arange(self.gpus), free)])

    # ------------------------------------------------------------------ swap gains
    def _other_max(self, Cx: np.ndarray) -> np.ndarray:
        """float ``[T, G, G]``: ``max_{g not in {a, b}} Cx[t, g]`` from the three largest."""
        T, G = Cx.shape
        k = min(3, G)
        order = np.argsort(-Cx, axis=1, kind="stable")[:, :k]
        vals = np.take_along_axis(Cx, order, axis=1)
        out = np.full((T, G, G), -np.inf)
        gid = np.arange(G)
        for q in range(k - 1, -1, -1):
            idx = order[:, q][:, None, None]
            ok = (idx != gid[None, :, None]) & (idx != gid[None, None, :])
            out = np.where(ok, vals[:, q][:, None, None], out)
        return out

    def gains(self, slot: np.ndarray, X: np.ndarray, Cx: np.ndarray, pa: np.ndarray, pb: np.ndarray) -> np.ndarray:
        """Change of S for every swap between GPUs ``pa[k]`` and ``pb[k]``.

        Parameters
        ----------
        slot
            int ``[G, slots]``: the (padded) experts on each GPU.
        X, Cx
            float ``[T, G]``: loads and latencies of the current mapping.
        pa, pb
            int ``[P]``: GPU pairs.

        Returns
        -------
        numpy.ndarray
            float ``[P, slots, slots]``: entry ``[k, p, q]`` swaps expert ``slot[pa[k], p]``
            with ``slot[pb[k], q]``.
        """
        T = self.n.shape[0]
        sl = self.slots
        peak_sum = Cx.max(axis=1).sum()
        other = self._other_max(Cx)
        width = self.J + 1
        flat = self.table.ravel()
        P = len(pa)
        dS = np.empty((P, sl, sl))
        per = max(1, _CHUNK // max(1, T * sl * sl))
        scale = 1.0 / self.tile
        if self.integral:
            Xi = np.round(X).astype(np.int32)
        for s in range(0, P, per):
            a, b = pa[s : s + per], pb[s : s + per]
            if self.integral:
                d = self.n_int[:, slot[b]][:, :, None, :] - self.n_int[:, slot[a]][:, :, :, None]
                oa = (Xi[:, a] + (a * self.width).astype(np.int32)[None, :])[:, :, None, None]
                ob = (Xi[:, b] + (b * self.width).astype(np.int32)[None, :])[:, :, None, None]
                new = np.maximum(self.lookup[oa + d], self.lookup[ob - d])
                np.maximum(new, other[:, a, b][:, :, None, None], out=new)
                dS[s : s + len(a)] = new.sum(axis=0) - peak_sum
                continue
            na = self.n[:, slot[a]]  # [T, k, sl]
            nb = self.n[:, slot[b]]
            d = nb[:, :, None, :] - na[:, :, :, None]  # [T, k, p, q]: n_j - n_i
            xa = X[:, a][:, :, None, None]
            xb = X[:, b][:, :, None, None]
            ta = np.ceil((xa + d) * scale - 1e-9).astype(np.int64).clip(0, self.J)
            tb = np.ceil((xb - d) * scale - 1e-9).astype(np.int64).clip(0, self.J)
            new = np.maximum(flat[ta + (a * width)[None, :, None, None]], flat[tb + (b * width)[None, :, None, None]])
            np.maximum(new, other[:, a, b][:, :, None, None], out=new)
            dS[s : s + len(a)] = new.sum(axis=0) - peak_sum
        return dS

    def quad_gains(self, slot: np.ndarray, X: np.ndarray, pa: np.ndarray, pb: np.ndarray) -> np.ndarray:
        """Change of ``Phi = sum_t sum_g X_tg^2 / speed_g`` for the swaps of `gains`.

        With ``d = n_j - n_i``: ``dPhi = sum_t d^2 (1/v_a + 1/v_b) + 2 d (X_a/v_a - X_b/v_b)``;
        the ``sum_t d^2`` terms come from one batched matrix product.
        """
        inv = 1.0 / self.speed
        na, nb = self.n[:, slot[pa]], self.n[:, slot[pb]]  # [T, P, sl]
        w = X[:, pa] * inv[pa] - X[:, pb] * inv[pb]  # [T, P]
        d2 = (na**2).sum(axis=0)[:, :, None] + (nb**2).sum(axis=0)[:, None, :] - 2 * np.einsum("tkp,tkq->kpq", na, nb)
        dw = np.einsum("tkq,tk->kq", nb, w)[:, None, :] - np.einsum("tkp,tk->kp", na, w)[:, :, None]
        return d2 * (inv[pa] + inv[pb])[:, None, None] + 2 * dw

    def slots_of(self, home: np.ndarray) -> np.ndarray:
        """int ``[G, slots]``: the padded experts on each GPU (every GPU has exactly ``slots``)."""
        return np.argsort(home, kind="stable").reshape(self.gpus, self.slots)

    def descend(
        self,
        home: np.ndarray,
        *,
        max_plateau: int | None = None,
        max_moves: int | None = None,
        stats: SearchStats | None = None,
    ) -> tuple[np.ndarray, float]:
        """Apply improving swaps until none lowers (S, Phi); returns the home vector and S.

        Only GPU pairs ``{a, b}`` containing every GPU at the maximum of some step can lower
        S with one swap (elsewhere that step's maximum stays), so S-gains are evaluated on
        those pairs only; plateau (Phi) moves consider pairs with a GPU at some maximum.
        """
        home = home.copy()
        G = self.gpus
        max_plateau = max(8, self.size // 4) if max_plateau is None else max_plateau
        max_moves = 20 * self.size if max_moves is None else max_moves
        tol = 1e-9 * self.scale
        plateau = 0
        gpu_ids = np.arange(G)[None, :]
        upper = np.triu(np.ones((G, G), dtype=bool), k=1)
        for _ in range(max_moves):
            X = self.loads(home)
            Cx = self.latency(X, gpu_ids)
            at_max = Cx >= Cx.max(axis=1, keepdims=True) - tol  # [T, G]
            count = at_max.sum(axis=1)
            lone = at_max[count == 1].any(axis=0)
            twin = at_max[count == 2]
            useful = lone[:, None] | lone[None, :] | (twin[:, :, None] & twin[:, None, :]).any(axis=0)
            slot = self.slots_of(home)
            crit = at_max.any(axis=0)
            pa, pb = np.nonzero((crit[:, None] | crit[None, :]) & upper)
            dS = self.gains(slot, X, Cx, pa, pb)
            improving = np.where(useful[pa, pb][:, None, None], dS, np.inf)
            if improving.min() < -tol:
                plateau = 0
                applied = self._apply_batch(home, slot, X, Cx, pa, pb, improving, tol)
                if stats is not None:
                    stats.moves += applied
                continue
            if plateau >= max_plateau:
                break
            dPhi = self.quad_gains(slot, X, pa, pb)
            thr = 1e-9 * (1.0 + float(X.max()) ** 2)
            key = np.where((np.abs(dS) <= tol) & (dPhi < -thr), dPhi, np.inf)
            if not np.isfinite(key).any():
                break
            applied = self._apply_batch(home, slot, X, Cx, pa, pb, key, tol, plateau=True)
            plateau += 1
            if stats is not None:
                stats.moves += applied
                stats.plateau_moves += applied
        return home, self.score(home)

    def _apply_batch(
        self,
        home: np.ndarray,
        slot: np.ndarray,
        X: np.ndarray,
        Cx: np.ndarray,
        pa: np.ndarray,
        pb: np.ndarray,
        dS: np.ndarray,
        tol: float,
        limit: int = 64,
        plateau: bool = False,
    ) -> int:
        """Apply the best improving swap, then further improving swaps on untouched GPU pairs
        in order of predicted gain, each kept only if the exact S (recomputed from the two
        changed GPUs) still drops. One gain evaluation thus yields several moves; every
        accepted move strictly lowers S, so the descent stays monotone. With ``plateau`` the
        ranking key is the change of Phi, and a move is kept when S does not grow (Phi, a sum
        over GPUs, drops by exactly the predicted amount on disjoint GPU pairs). Mutates the
        inputs.
        """
        flat = np.nonzero((dS < -tol).ravel() if not plateau else np.isfinite(dS).ravel())[0]
        flat = flat[np.argsort(dS.ravel()[flat], kind="stable")][: 4 * limit]
        touched = np.zeros(self.gpus, dtype=bool)
        current = float(Cx.max(axis=1).sum())
        applied = 0
        sl2 = self.slots * self.slots
        for f in flat:
            k, p, q = f // sl2, (f % sl2) // self.slots, f % self.slots
            a, b = pa[k], pb[k]
            if touched[a] or touched[b]:
                continue
            i, j = slot[a, p], slot[b, q]
            d = self.n[:, j] - self.n[:, i]
            xa, xb = X[:, a] + d, X[:, b] - d
            old_a, old_b = Cx[:, a].copy(), Cx[:, b].copy()
            Cx[:, a], Cx[:, b] = self.table[a, self.tiles(xa)], self.table[b, self.tiles(xb)]
            new = float(Cx.max(axis=1).sum())
            if new < current - tol or (plateau and new <= current + tol):
                X[:, a], X[:, b] = xa, xb
                home[i], home[j] = b, a
                touched[a] = touched[b] = True
                current = new
                applied += 1
                if applied >= limit:
                    break
            else:
                Cx[:, a], Cx[:, b] = old_a, old_b
        return applied

    # ------------------------------------------------------------------ perturbation
    def perturb(self, home: np.ndarray, swaps: int, rng: np.random.Generator) -> np.ndarray:
        """``swaps`` random swaps, each moving an expert off a critical GPU."""
        home = home.copy()
        gpu_ids = np.arange(self.gpus)[None, :]
        Cx = self.latency(self.loads(home), gpu_ids)
        critical = (Cx >= Cx.max(axis=1, keepdims=True) - 1e-9 * self.scale).any(axis=0)
        for _ in range(swaps):
            hot = np.nonzero(critical[home[: self.experts]])[0]
            i = int(rng.choice(hot)) if len(hot) and rng.random() < 0.7 else int(rng.integers(self.experts))
            others = np.nonzero(home != home[i])[0]
            if not len(others):
                break
            j = int(rng.choice(others))
            home[i], home[j] = home[j], home[i]
        return home


# ----------------------------------------------------------------------------- initial mappings
def speed_greedy_homes(load: np.ndarray, speed: np.ndarray, slots: int) -> np.ndarray:
    """LPT weighted by speed: heaviest expert first onto the GPU finishing earliest."""
    return balanced_homes(np.asarray(load, dtype=np.float64), len(speed), slots, speed)


def temporal_greedy_homes(
    search: LayerSearch,
    n: np.ndarray,
    classes: ExpertClasses,
    order_key: np.ndarray,
    *,
    slow_share: float = 0.25,
) -> np.ndarray:
    """Step-aware greedy: each expert (by ``order_key``, descending) goes where the partial
    S grows least (ties: least speed-weighted quadratic load), keeping correlated temporal
    experts on different GPUs and heavy experts off the slowest GPUs when possible.

    Parameters
    ----------
    search
        The layer's search (profile table, slots, speeds).
    n
        float ``[T, E]`` utilization trace.
    classes
        The experts' classification (heavy experts, correlated temporal pairs).
    order_key
        float ``[E]``: placement order, largest first (noisy for diverse starts).
    slow_share
        Fraction of the GPUs (the slowest) kept free of heavy experts when possible.

    Returns
    -------
    numpy.ndarray
        int ``[E]`` home GPUs within the slot capacities.
    """
    T, E = n.shape
    G, slots = search.gpus, search.slots
    speed = search.speed
    slow = np.zeros(G, dtype=bool)
    n_slow = int(np.floor(slow_share * G)) if G >= 3 else 0
    if n_slow:
        slow[np.argsort(speed, kind="stable")[:n_slow]] = True
    partners = classes.partners()
    heavy = classes.heavy
    X = np.zeros((T, G))
    C = search.latency(X, np.arange(G)[None, :])
    home = np.full(E, -1)
    used = np.zeros(G, dtype=np.int64)
    gpu_ids = np.arange(G)
    for e in np.argsort(-order_key, kind="stable"):
        free = used < slots
        allowed = free.copy()
        if heavy[e]:
            allowed &= ~slow
        mates = home[partners[e] & (home >= 0)]
        allowed[mates] = False
        if not allowed.any():
            allowed = free & ~np.isin(gpu_ids, mates)
        if not allowed.any():
            allowed = free
        newC = search.latency(X + n[:, e : e + 1], gpu_ids[None, :])  # [T, G]: e on g
        others = np.where(np.eye(G, dtype=bool)[None, :, :], -np.inf, C[:, None, :]).max(axis=2)  # [T, G]
        partial = np.maximum(newC, others).sum(axis=0)
        quad = ((2 * X * n[:, e : e + 1] + n[:, e : e + 1] ** 2) / speed[None, :]).sum(axis=0)
        partial = np.where(allowed, partial, np.inf)
        best_s = partial.min()
        cand = np.where(partial <= best_s + 1e-9 * search.scale, quad, np.inf)
        g = int(np.argmin(cand))
        home[e] = g
        used[g] += 1
        X[:, g] += n[:, e]
        C[:, g] = search.latency(X[:, g], np.full(T, g))
    return home


# ----------------------------------------------------------------------------- driver
@dataclass(frozen=True)
class SearchSettings:
    """Knobs of `search_layer` (the ``gem`` method's parameters)."""

    starts: int = 8
    noise: float = 0.15
    rounds: int = 400
    patience: int = 60
    perturb: int = 0  # swaps per perturbation; 0: random in [2, max(3, E // 8)] each round
    plateau_after_perturbation: int = 4  # plateau iterations allowed in each perturbation's descent
    rho: float = 0.5
    time_limit: float | None = None  # seconds for this layer (starts included): a cap, reported when it binds
    ils_time: float | None = None  # seconds for the perturbation rounds (a wall cap: None keeps runs reproducible)
    accept: float = 0.0  # accept local optima up to this fraction worse than the best


def initial_mappings(
    search: LayerSearch,
    n: np.ndarray,
    classes: ExpertClasses,
    settings: SearchSettings,
    rng: np.random.Generator,
    hint: np.ndarray | None = None,
) -> list[np.ndarray]:
    """The initial mappings of one layer.

    Alternately speed-aware LPT and step-aware greedy; the first two without noise, the rest
    on loads multiplied by lognormal noise; a slot-feasible hint (if any) first.

    Parameters
    ----------
    search
        The layer's search.
    n
        float ``[T, E]`` utilization trace.
    classes
        The experts' classification.
    settings
        Number of starts and noise level.
    rng
        Random generator of the noise.
    hint
        Optional home vector ``[E]``.

    Returns
    -------
    list of numpy.ndarray
        Padded home vectors (dummies fill the free slots).
    """
    mean = n.mean(axis=0)
    peak = n.max(axis=0)
    starts: list[np.ndarray] = []
    if hint is not None:
        hint = np.asarray(hint, dtype=np.int64)
        fits = hint.shape == (search.experts,) and hint.min(initial=0) >= 0 and hint.max(initial=0) < search.gpus
        if fits and np.bincount(hint, minlength=search.gpus).max() <= search.slots:
            starts.append(search.pad(hint))  # a hint that violates the slots is ignored
    for s in range(settings.starts):
        noise = np.exp(settings.noise * rng.standard_normal(len(mean))) if s >= 2 else 1.0
        if s % 2 == 0:
            home = speed_greedy_homes(mean * noise, search.speed, search.slots)
        else:
            home = temporal_greedy_homes(search, n, classes, (0.5 * mean + 0.5 * peak) * noise)
        starts.append(search.pad(home))
    return starts


class _GemSpace:
    """GEM's perturbation rounds as a landscape of `moeopt.moves.driver.iterate`: a kick
    is `LayerSearch.perturb` (a given or random number of swaps off critical GPUs), the
    descent `LayerSearch.descend` with the short plateau budget, the value S."""

    def __init__(self, search: LayerSearch, settings: SearchSettings, stats: SearchStats) -> None:
        self.search, self.settings, self.stats = search, settings, stats
        self.strongest = max(4, search.experts // 8)
        self._last: tuple[np.ndarray, float] | None = None  # the last descended home and its S

    def kick(self, home: np.ndarray, rng: np.random.Generator, round: int) -> np.ndarray:
        swaps = self.settings.perturb or int(rng.integers(2, self.strongest + 1))
        return self.search.perturb(home, swaps, rng)

    def descend(self, home: np.ndarray, round: int) -> np.ndarray:
        if round < 0:  # the start: the best of the multi-start descents
            return home
        out, s = self.search.descend(home, max_plateau=self.settings.plateau_after_perturbation, stats=self.stats)
        self._last = (out, s)
        return out

    def value(self, home: np.ndarray) -> float:
        if self._last is not None and self._last[0] is home:
            return self._last[1]
        return self.search.score(home)


def search_layer(
    n: np.ndarray,
    profile: Profile,
    slots: int,
    settings: SearchSettings = SearchSettings(),
    *,
    seed: int = 0,
    hint: np.ndarray | None = None,
) -> tuple[np.ndarray, float, SearchStats]:
    """Multi-start pairwise-swap search with perturbation for one layer.

    Parameters
    ----------
    n
        float ``[T, E]`` utilization trace.
    profile
        Latency profile (G GPUs).
    slots
        Slots per GPU.
    settings
        Starts, noise, perturbation rounds, time limit.
    seed
        Seed of the noise and perturbations.
    hint
        Optional home vector ``[E]`` used as an extra start.

    Returns
    -------
    tuple
        ``(home [E], S, stats)``: the best mapping found, its straggler latency on ``n`` and
        what the search did (``stats.initial`` holds every initial mapping's S, which the
        result never exceeds).
    """
    t0 = time.perf_counter()
    deadline = None if settings.time_limit is None else t0 + settings.time_limit
    rng = np.random.default_rng(seed)
    search = LayerSearch(n, profile, slots)
    classes = classify_experts(n, rho=settings.rho)
    stats = SearchStats()
    best_home, best_s = None, np.inf
    for start in initial_mappings(search, n, classes, settings, rng, hint):
        stats.initial.append(search.score(start))
        if best_home is not None and deadline is not None and time.perf_counter() > deadline:
            stats.capped = True
            continue
        home, s = search.descend(start, stats=stats)
        stats.descended.append(s)
        if s < best_s - 1e-12:
            best_home, best_s = home, s
    assert best_home is not None
    ils_start: np.ndarray = best_home
    if settings.ils_time is not None:
        ils_end = time.perf_counter() + settings.ils_time
        deadline = ils_end if deadline is None else min(deadline, ils_end)
    # iterated local search on the one driver: walk on to local optima up to ``accept``
    # (relative) worse than the best, so the search can leave a basin; else back to the best
    space = _GemSpace(search, settings, stats)
    found, best_s, log = iterate(
        space,
        ils_start,
        rng,
        rounds=settings.rounds,
        patience=settings.patience,
        tol=1e-9 * search.scale,
        deadline=deadline,
        accept=lambda s, current, best: s <= best * (1.0 + settings.accept) + 1e-12,
    )
    stats.rounds += log.rounds
    stats.improvements += log.improvements
    stats.capped = stats.capped or log.capped
    stats.time = time.perf_counter() - t0
    return found[: search.experts].copy(), best_s, stats
