"""agents: the programs that pursue a goal through the runner verbs (first: the no-LLM sweep)."""
