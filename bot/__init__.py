"""bot: the Slack surface — intake, threads, approvals, steering, digests, runner links."""
