"""tuner: search space, sharding patterns, Optuna study, history and resume."""
