"""Latency profiles C_g(n): one MoE layer's latency on GPU g given n tokens (SPEC section 5).

A profile is a non-decreasing step function stored at tile boundaries:
``C_g(n) = P[g, ceil(n / tile)]``. Beyond the last stored boundary it is extended affinely
with the last step's increment, so any token count has a latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moeopt.errors import InputError

#: Speed spread (half-width, relative) of each synthetic variability level.
VARIABILITY = {"none": 0.0, "low": 0.05, "medium": 0.15, "high": 0.30}


@dataclass(frozen=True, eq=False)
class Profile:
    """Per-GPU latency tables at tile boundaries.

    Attributes
    ----------
    tile
        Tile size in tokens (32 or 64 typically).
    latency
        float ``[G, K + 1]``: latency with ``j`` tiles of tokens, ``j = 0..K`` (milliseconds).
    names
        Optional GPU names.
    meta
        Free-form provenance (device, sampling times, generator parameters).
    """

    tile: int
    latency: np.ndarray
    names: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        lat = np.asarray(self.latency, dtype=np.float64)
        if lat.ndim != 2 or lat.shape[1] < 2:
            raise InputError(None, "profile.gpus[].latency", "expected at least two tile boundaries per GPU")
        if not np.isfinite(lat).all() or (lat < 0).any():
            raise InputError(None, "profile.gpus[].latency", "latencies must be finite and >= 0")
        if (np.diff(lat, axis=1) < -1e-12).any():
            raise InputError(None, "profile.gpus[].latency", "latencies must be non-decreasing in tokens")
        if self.tile < 1:
            raise InputError(None, "profile.tile", f"must be a positive integer, got {self.tile}")
        object.__setattr__(self, "latency", lat)

    @property
    def gpus(self) -> int:
        return int(self.latency.shape[0])

    @property
    def max_tiles(self) -> int:
        return int(self.latency.shape[1] - 1)

    @property
    def speed(self) -> np.ndarray:
        """Relative speed of each GPU: inverse of its latency slope, normalised to mean 1."""
        slope = (self.latency[:, -1] - self.latency[:, 0]) / self.max_tiles
        inv = 1.0 / np.maximum(slope, 1e-15)
        return np.asarray(inv / inv.mean())

    def tiles(self, tokens: np.ndarray) -> np.ndarray:
        return np.ceil(np.asarray(tokens, dtype=np.float64) / self.tile - 1e-9).astype(np.int64).clip(0)

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        """C_g(n) for ``tokens`` of shape ``[..., G]`` (the last axis is the GPU)."""
        j = self.tiles(tokens)
        K = self.max_tiles
        g = np.broadcast_to(np.arange(self.gpus), j.shape)
        inside = self.latency[g, np.minimum(j, K)]
        step = self.latency[:, K] - self.latency[:, K - 1]
        return np.asarray(inside + np.maximum(j - K, 0) * step[g])

    def broadcast(self, gpus: int) -> Profile:
        """This one-GPU profile repeated for ``gpus`` identical GPUs (a measured single GPU used on a
        homogeneous cluster); ``meta['note']`` says so.

        Raises
        ------
        InputError
            When the profile has more than one GPU or ``gpus < 1``.
        """
        if self.gpus != 1 or gpus < 1:
            raise InputError(None, "profile", f"only a one-GPU profile broadcasts; this one has {self.gpus} GPUs")
        name = self.names[0] if self.names else "gpu0"
        recorded = self.meta.get("speeds")  # a measured profile's emulated speed, one per row
        speeds = {"speeds": list(recorded) * gpus} if isinstance(recorded, list) and len(recorded) == 1 else {}
        note = f"profile: one GPU broadcast to {gpus} identical GPUs"
        return Profile(
            tile=self.tile,
            latency=np.repeat(self.latency, gpus, axis=0),
            names=tuple(f"{name}#{g}" for g in range(gpus)) if gpus > 1 else (name,),
            meta={**self.meta, **speeds, "broadcast_from": name, "note": note},
        )

    def table(self, tiles: int) -> np.ndarray:
        """``[G, tiles + 1]`` latencies at 0..tiles tile counts (extended past K if needed)."""
        return np.asarray(self(np.arange(tiles + 1)[:, None] * self.tile * np.ones((1, self.gpus))).T)


def synthetic_profile(
    gpus: int,
    *,
    variability: str | float = "medium",
    seed: int = 0,
    tile: int = 64,
    max_tiles: int = 64,
    alpha: float = 0.05,
    beta: float = 0.10,
) -> Profile:
    """The synthetic model ``C_g(n) = (alpha * ceil(n / tile) + beta) / speed_g``.

    Speeds are drawn uniformly in ``1 +/- spread`` with spread 5 / 15 / 30 % for
    ``low`` / ``medium`` / ``high`` variability (or a number given directly).
    """
    if isinstance(variability, str):
        if variability not in VARIABILITY:
            raise InputError(None, "profile.variability", f"expected one of {sorted(VARIABILITY)}, got {variability!r}")
        spread = VARIABILITY[variability]
    else:
        spread = float(variability)
    rng = np.random.default_rng(seed)
    speed = 1.0 + spread * rng.uniform(-1.0, 1.0, size=gpus)
    j = np.arange(max_tiles + 1)
    latency = (alpha * j[None, :] + beta) / speed[:, None]
    return Profile(
        tile=tile,
        latency=latency,
        names=tuple(f"gpu{g}" for g in range(gpus)),
        meta={
            "source": "synthetic",
            "variability": variability,
            "seed": seed,
            "alpha": alpha,
            "beta": beta,
            "speeds": speed.round(6).tolist(),
        },
    )
