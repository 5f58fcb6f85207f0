"""Built-in methods; importing this package registers them."""

from moeopt.methods import (
    auto,  # noqa: F401
    balance,  # noqa: F401
    baselines,  # noqa: F401
    crosslayer,  # noqa: F401
    eplb,  # noqa: F401
    gem,  # noqa: F401
    gesr,  # noqa: F401
    hypergraph,  # noqa: F401
    joint,  # noqa: F401
    tacg,  # noqa: F401
)
