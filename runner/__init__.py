"""runner: the daemon on the GPU box: goals, budgets, experiments, approvals, the event log."""
