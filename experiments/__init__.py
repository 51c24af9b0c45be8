"""experiments: reproducible experiments and report builders."""
