"""display: what people see of a goal, for every surface: facts, terminal text, plots."""
