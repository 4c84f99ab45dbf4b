"""Suite-wide settings.

Hypothesis' per-example deadline measures wall time, which on a busy 2-core
machine says more about the neighbours than about the code; the suite's
property tests assert behaviour, not speed (benchmarks live in bench/).
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "halfmoon",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("halfmoon")
