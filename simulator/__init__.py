"""simulator: op cost (roofline), memory model, pipeline schedules, the SimPy engine and
traces. Imports completion and clusters; knows nothing about Optuna."""
