"""Built-in methods; importing this package registers them."""

from moeopt.methods import baselines  # noqa: F401
from moeopt.methods import tacg  # noqa: F401
from moeopt.methods import gesr  # noqa: F401
from moeopt.methods import hypergraph  # noqa: F401
from moeopt.methods import gem  # noqa: F401
