"""The star-count workload's numpy MLP: it learns, it saves and loads its weights as plain arrays,
and the runner's evaluation refuses anything else (never unpickling what an agent left)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from goaltender.environments.star_count import mlp


def test_it_learns_a_noisy_linear_map_and_its_loss_falls():
    rng = np.random.RandomState(0)
    X = rng.rand(600, 12).astype(np.float32)
    Y = (X @ rng.rand(12, 3) * 2).astype(np.float32)
    model = mlp.MLP(12, 32, 3, lr=0.01, seed=0)
    losses = [model.fit_epoch(X, Y, batch_size=50) for _ in range(60)]
    assert losses[-1] < losses[0] / 20
    assert np.abs(model.predict(X) - Y).mean() < 0.1


def test_the_same_seed_trains_the_same_model():
    X = np.random.RandomState(1).rand(100, 5).astype(np.float32)
    Y = X[:, :2].copy()
    a, b = mlp.MLP(5, 8, 2, lr=0.01, seed=3), mlp.MLP(5, 8, 2, lr=0.01, seed=3)
    for model in (a, b):
        for _ in range(5):
            model.fit_epoch(X, Y, batch_size=32)
    assert np.array_equal(a.predict(X), b.predict(X))


def test_weights_round_trip_through_npz_with_their_meta(tmp_path):
    X = np.random.RandomState(2).rand(40, 6).astype(np.float32)
    model = mlp.MLP(6, 4, 3, lr=0.01, seed=0)
    model.fit_epoch(X, X[:, :3], batch_size=10)
    model.save(tmp_path / "model.npz", resolution=16, config="abc")
    loaded, meta = mlp.load(tmp_path / "model.npz")
    assert meta == {"resolution": 16, "config": "abc"}
    assert np.array_equal(loaded.predict(X), model.predict(X))
    assert not list(tmp_path.glob("*.tmp"))


def test_an_npz_holding_objects_is_refused_not_unpickled(tmp_path):
    path = tmp_path / "model.npz"
    np.savez(path, W1=np.array([{"evil": True}], dtype=object), b1=0, W2=0, b2=0)
    with pytest.raises(ValueError, match="allow_pickle"):
        mlp.load(path)


def test_the_evaluation_refuses_a_pickle_dressed_as_the_model(tmp_path):
    (tmp_path / "model.npz").write_bytes(pickle.dumps({"model": "anything"}))
    env = {
        **os.environ,
        "GOALTENDER_EXPERIMENT_DIR": str(tmp_path),
        "GOALTENDER_CACHE_DIR": str(tmp_path / "c"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "goaltender.environments.star_count.evaluate"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1
    assert "is not a saved star-count model" in done.stderr
