"""Forecast each expert's load for the coming steps from the recent ones (SPEC section 12).

A plan made on the last window serves the *next* steps: on a stream that drifts, the last
window's mean load lags the traffic by half a window when it is made and by a whole interval
more by the end of its service. [`forecast_loads`][moeopt.replay.forecast.forecast_loads] estimates, per layer and
expert, the share of the layer's load the coming steps will carry:

* **level**: an exponentially weighted mean of the recent steps' shares, its half-life chosen
  per layer from a grid (`HALFLIVES`) as the one whose one-step-ahead forecasts over the
  recent steps erred least (squared error of the shares): a stream that holds still (a domain
  served for a while) is averaged over many steps, one that wanders (a random walk of the
  popularity) over the last step or two;
* **trend**: a per-expert least-squares slope of the shares over the recent steps, shrunk
  toward zero by its standard error (``slope * max(0, 1 - se^2 / slope^2)``, a positive-part
  James-Stein factor, so a slope within the noise counts for nothing), added for the level's
  lag plus the horizon.

The forecast is clipped at zero, renormalized to the layer's mean shares and scaled to the
recent steps' mean load, so that it is a load snapshot like the others (count units).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["HALFLIVES", "Forecast", "ewma_weights", "forecast_loads", "shrunk_slopes", "step_shares"]

#: the half-lives (in steps) the level chooses from; ``inf``: the plain mean of the recent steps
HALFLIVES: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, float("inf"))


@dataclass(frozen=True, eq=False)
class Forecast:
    """A forecast of each expert's load over the coming steps.

    Attributes
    ----------
    loads
        float ``[L, E]``: the forecast load per step (count units: the recent steps' mean
        total load per layer, split by the forecast shares).
    halflife
        float ``[L]``: the level's half-life chosen per layer (``inf``: the plain mean).
    trend
        float ``[L, E]``: the shrunk per-step slope of each expert's share (0 without trend).
    """

    loads: np.ndarray
    halflife: np.ndarray
    trend: np.ndarray


def step_shares(counts: np.ndarray) -> np.ndarray:
    """float ``[L, m, E]``: each step's load as shares of that step's total per layer (a step
    without load: all zeros)."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum(axis=2, keepdims=True)
    return np.divide(c, total, out=np.zeros_like(c), where=total > 0)


def ewma_weights(m: int, halflife: float) -> np.ndarray:
    """float ``[m]``: the exponentially weighted mean's weights of ``m`` steps, oldest first,
    summing to 1 (``halflife`` in steps; ``inf``: equal weights)."""
    age = np.arange(m - 1, -1, -1, dtype=np.float64)
    w = np.ones(m) if not np.isfinite(halflife) else np.exp2(-age / halflife)
    return np.asarray(w / w.sum())


def shrunk_slopes(x: np.ndarray) -> np.ndarray:
    """float ``[..., E]``: the least-squares slope per step of ``x [..., m, E]`` over its ``m``
    steps, shrunk toward zero by its standard error (``slope * max(0, 1 - se^2 / slope^2)``);
    zeros with fewer than 3 steps (no residual to judge a slope by)."""
    m = x.shape[-2]
    if m < 3:
        return np.zeros(x.shape[:-2] + x.shape[-1:])
    t = np.arange(m, dtype=np.float64) - (m - 1) / 2.0
    sxx = float((t * t).sum())
    xm = x.mean(axis=-2, keepdims=True)
    slope = np.einsum("t,...te->...e", t, x - xm) / sxx
    resid = x - xm - t[:, None] * slope[..., None, :]
    se2 = (resid * resid).sum(axis=-2) / (m - 2) / sxx
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(slope != 0, np.clip(1.0 - se2 / (slope * slope), 0.0, 1.0), 0.0)
    return np.asarray(slope * factor)


def _backtest(x: np.ndarray, halflives: tuple[float, ...]) -> np.ndarray:
    """float ``[L, H]``: the squared error of each half-life's one-step-ahead forecasts of the
    shares ``x [L, m, E]`` over its steps 1 .. m - 1 (each from the steps before it)."""
    L, m, _E = x.shape
    err = np.zeros((L, len(halflives)))
    for i, h in enumerate(halflives):
        for t in range(1, m):
            pred = np.einsum("s,lse->le", ewma_weights(t, h), x[:, :t])
            err[:, i] += ((pred - x[:, t]) ** 2).sum(axis=1)
    return err


def forecast_loads(
    counts: np.ndarray,
    horizon: float,
    *,
    halflife: float | None = None,
    trend: bool = True,
    halflives: tuple[float, ...] = HALFLIVES,
) -> Forecast:
    """Forecast each expert's mean load over the next steps from the recent ones.

    Parameters
    ----------
    counts
        float ``[L, m, E]``: the recent steps' loads, oldest first (``m >= 1``).
    horizon
        Steps from the last recent step to the middle of the steps the forecast is for (a plan
        serving the next ``c`` steps: ``(c + 1) / 2``).
    halflife
        The level's half-life in steps; None: chosen per layer from ``halflives`` by the
        one-step-ahead error over the recent steps (with fewer than 3 steps: the plain mean).
    trend
        Add each expert's shrunk least-squares slope ([`shrunk_slopes`][moeopt.replay.forecast.shrunk_slopes]) for the
        level's lag plus ``horizon``.
    halflives
        The grid ``halflife: None`` chooses from.

    Returns
    -------
    Forecast
    """
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 3 or c.shape[1] < 1:
        raise ValueError(f"counts must be [layers, steps >= 1, experts], got shape {c.shape}")
    L, m, _E = c.shape
    x = step_shares(c)
    if halflife is not None:
        chosen = np.full(L, float(halflife))
    elif m < 3:
        chosen = np.full(L, float("inf"))
    else:
        grid = np.asarray(halflives, dtype=np.float64)
        chosen = grid[np.argmin(_backtest(x, halflives), axis=1)]
    level = np.empty((L, x.shape[2]))
    lag = np.empty(L)
    age = np.arange(m - 1, -1, -1, dtype=np.float64)
    for l in range(L):
        w = ewma_weights(m, float(chosen[l]))
        level[l] = w @ x[l]
        lag[l] = float(w @ age)  # the level's centre, in steps before the last one
    slopes = shrunk_slopes(x) if trend else np.zeros_like(level)
    share = np.clip(level + slopes * (lag + float(horizon))[:, None], 0.0, None)
    # keep each layer's total share (top-k slots per token: shares of a step sum to 1)
    have = share.sum(axis=1, keepdims=True)
    share = np.divide(share, have, out=np.zeros_like(share), where=have > 0)
    scale = c.sum(axis=2).mean(axis=1)  # mean load per step, per layer
    return Forecast(loads=share * scale[:, None], halflife=chosen, trend=slopes)
