"""NeMo Gym resources server for the star-count task.

Lives in a Gym checkout as ``resources_servers/star_count/app.py``. Dataset rows carry the true
``counts`` (and ``stars``, ``seed``) as extra top-level fields, which Gym forwards into the verify
request. The reward is partial credit: the fraction of colours counted exactly; ``correct`` says
whether every colour was right.

Only Gym imports this file (nemo_gym needs Python >= 3.12); goaltender never does.
"""

import importlib.util
import sys
from pathlib import Path
from typing import Any

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from pydantic import Field


def _load_sibling(name: str) -> Any:
    """Load ``<name>.py`` from this directory by path (stdlib-only module; no package needed)."""
    module_name = f"_star_count_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, Path(__file__).with_name(f"{name}.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name}.py next to {__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


_verify_module = _load_sibling("verify")


class StarCountResourcesServerConfig(BaseResourcesServerConfig):
    pass


class StarCountVerifyRequest(BaseVerifyRequest):
    counts: dict[str, int]
    stars: list[dict[str, Any]] | None = None
    seed: int | None = None


class StarCountVerifyResponse(StarCountVerifyRequest, BaseVerifyResponse):
    correct: bool
    predicted: dict[str, int] | None = None
    per_colour_correct: dict[str, bool] = Field(default_factory=dict)


# Headline metrics: mean/correct is the exact accuracy (every colour right), mean/reward the mean
# partial credit -- goaltender's ``exact_accuracy`` and ``mean_reward``. Gym's default (every mean/*)
# would also headline mean/seed, which is just the average row seed.
KEY_METRICS = ("mean/reward", "mean/correct")


class StarCountResourcesServer(SimpleResourcesServer):
    config: StarCountResourcesServerConfig

    async def verify(self, body: StarCountVerifyRequest) -> StarCountVerifyResponse:
        text = body.response.output_text or ""
        verdict = _verify_module.verify(body.counts, text)
        return StarCountVerifyResponse(
            **body.model_dump(),
            reward=verdict.reward,
            correct=verdict.correct,
            predicted=verdict.predicted,
            per_colour_correct=verdict.per_colour,
        )

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        return {name: agent_metrics[name] for name in KEY_METRICS if name in agent_metrics}


if __name__ == "__main__":
    StarCountResourcesServer.run_webserver()
