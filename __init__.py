"""Goaltender: agentic ML research campaigns on your GPU box, steered from Slack.

The repository root is this package (see pyproject.toml): ``bot/``, ``runner/``, ``storage/``,
``agents/``, ``environments/`` and ``display/`` import as ``goaltender.bot``, ``goaltender.runner``, …
"""
