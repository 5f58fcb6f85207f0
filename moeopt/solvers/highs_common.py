"""HiGHS's thread scheduler is global to the process.

The first HiGHS solve sizes it; a later solve asking for another thread count fails inside
HiGHS ("the scheduler has already been initialized") and comes back as a time limit without
a solution. Anything may have sized it before (another backend, the user's own HiGHS
code), so every HiGHS call in moeopt goes through :func:`highs_threads`, which resets the
scheduler first; rebuilding a thread pool costs far less than any solve.
"""

from __future__ import annotations


def highs_threads(threads: int) -> int:
    """Reset HiGHS's global scheduler so the next solve can use ``threads``; return that count."""
    import highspy

    highspy.Highs.resetGlobalScheduler(True)
    return max(1, int(threads))
