"""The one list of ops that draw random numbers when they run."""
from __future__ import annotations

__all__ = ["RANDOM_OPS"]

# By op name as capture records it. Dropout draws only in training; the others always.
# Replay needs the RNG state recorded before each of them, comparison says a difference
# there may be a different draw, and a sweep's prefix cache records nothing from a run
# that makes one.
RANDOM_OPS = frozenset({
    "dropout", "dropout_", "dropout1d", "dropout2d", "dropout3d", "feature_dropout",
    "feature_dropout_", "alpha_dropout", "alpha_dropout_", "feature_alpha_dropout",
    "feature_alpha_dropout_", "native_dropout", "_fused_dropout", "bernoulli", "bernoulli_",
    "multinomial", "normal", "normal_", "poisson", "binomial", "_standard_gamma", "rand",
    "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "rrelu", "rrelu_",
    "uniform_", "random_", "exponential_", "geometric_", "cauchy_", "log_normal_",
    "gumbel_softmax", "fractional_max_pool2d", "fractional_max_pool3d",
})
