"""Tests for the star-count task environment (generator, verifier, export, workload)."""

from __future__ import annotations

import ast
import base64
import io
import json
import math
import os
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from goaltender.environments.star_count import export, workload
from goaltender.environments.star_count.generate import (
    DEFAULT_CONFIG,
    HELDOUT_SEED_OFFSET,
    HELDOUT_SIZE,
    StarCountConfig,
    counts_of,
    heldout_seeds,
    heldout_split,
    make_example,
    render,
    train_seeds,
    train_split,
)
from goaltender.environments.star_count.prompt import SYSTEM_PROMPT, format_answer, user_prompt
from goaltender.environments.star_count.verify import parse_answer, score, verify

PKG_DIR = Path(__file__).resolve().parents[1] / "environments" / "star_count"
REPO_ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {"red": 3, "green": 0, "blue": 1}


# ----------------------------------------------------------------------------- generator


def test_same_seed_gives_identical_example_and_pixels():
    a, b = make_example(123), make_example(123)
    assert a == b
    assert render(a).tobytes() == render(b).tobytes()
    c = make_example(124)
    assert (c.stars, c.counts) != (a.stars, a.counts)


def test_generator_is_pinned():
    # random.Random(seed) is platform independent; these pin the generator (and the held-out split).
    assert make_example(0).counts == {"red": 3, "green": 0, "blue": 2}
    assert make_example(HELDOUT_SEED_OFFSET).counts == {"red": 1, "green": 0, "blue": 1}
    assert sum(sum(ex.counts.values()) for ex in heldout_split()) == 294


def drawn_then_resized(example):
    """How render() made a canvas before it box-averaged only around the stars: draw it `supersample`
    times larger, then resize the whole of it."""
    from PIL import ImageDraw

    from goaltender.environments.star_count.generate import star_polygon

    ss = example.supersample
    img = Image.new("RGB", (example.width * ss, example.height * ss), example.background)
    draw = ImageDraw.Draw(img)
    for star in example.stars:
        draw.polygon(star_polygon(star, example.inner_ratio, scale=ss), fill=star.rgb)
    return img.resize((example.width, example.height), Image.Resampling.BOX)


@pytest.mark.parametrize(
    ("cfg", "seeds"),
    [
        (DEFAULT_CONFIG, [*range(600), *heldout_seeds()]),  # cached arrays stay valid (CACHE_VERSION 1)
        (StarCountConfig(supersample=3, resolutions=(8, 13, 31)), range(200)),  # odd sides, stars at edges
        (StarCountConfig(supersample=4, max_overlap=0.5, count_range=(2, 5)), range(200)),  # overlaps
    ],
)
def test_render_is_the_whole_canvas_resized_pixel_for_pixel(cfg, seeds):
    for seed in seeds:
        example = make_example(seed, cfg)
        assert render(example).tobytes() == drawn_then_resized(example).tobytes(), seed


def test_heldout_split_is_fixed_and_disjoint_from_train():
    held = heldout_split()
    assert len(held) == HELDOUT_SIZE == 64
    assert [ex.seed for ex in held] == [HELDOUT_SEED_OFFSET + i for i in range(64)]
    train = train_split(50)
    assert [ex.seed for ex in train] == list(range(50))
    assert not {ex.seed for ex in held} & set(train_seeds(100_000))
    with pytest.raises(ValueError):
        train_seeds(HELDOUT_SEED_OFFSET + 1)


def test_counts_match_the_stars_drawn():
    cfg = DEFAULT_CONFIG
    lo, hi = cfg.count_range
    for ex in train_split(40) + heldout_split()[:10]:
        assert list(ex.counts) == cfg.colour_names  # every colour, zero included
        assert ex.counts == counts_of(ex.stars, cfg.colours)
        assert all(lo <= n <= hi for n in ex.counts.values())
        assert ex.width in cfg.resolutions and ex.height == ex.width
        img = render(ex)
        assert img.size == (ex.width, ex.height) and img.mode == "RGB"
        for s in ex.stars:
            # fully on the canvas, and the star's centre pixel has the star's colour
            assert s.radius <= s.x <= ex.width - s.radius and s.radius <= s.y <= ex.height - s.radius
            assert img.getpixel((int(s.x), int(s.y))) == s.rgb
            assert s.rgb == cfg.colours[s.colour]
        # max_overlap = 0: circumscribed circles never intersect
        for s, t in combinations(ex.stars, 2):
            assert math.hypot(s.x - t.x, s.y - t.y) >= s.radius + t.radius - 1e-9
    empty = make_example(7, StarCountConfig(count_range=(0, 0)))
    assert empty.stars == () and set(empty.counts.values()) == {0}
    pixels = np.asarray(render(empty)).reshape(-1, 3)
    assert {tuple(p) for p in pixels.tolist()} == {DEFAULT_CONFIG.background}


def test_overlap_config_and_validation():
    cfg = StarCountConfig(max_overlap=0.5, count_range=(2, 4), radius_range=(0.1, 0.12))
    ex = make_example(3, cfg)
    assert sum(ex.counts.values()) == len(ex.stars) >= 6
    with pytest.raises(ValueError):
        StarCountConfig(max_overlap=1.0)
    with pytest.raises(ValueError):
        StarCountConfig(count_range=(3, 1))


# ----------------------------------------------------------------------------- verifier (hand-checked)


@pytest.mark.parametrize(
    "text",
    [
        r"\boxed{red: 3, green: 0, blue: 1}",
        r"Let me count. \boxed{Red: 3, GREEN: 0, blue: 1}",
        '{"red": 3, "green": 0, "blue": 1}',
        r'\boxed{{"red": 3, "green": 0, "blue": 1}}',
        'First guess {"red": 1, "green": 0, "blue": 1}; final answer: {"red": 3, "green": 0, "blue": 1} done.',
        r"\boxed{red: 1, green: 0, blue: 1} no wait \boxed{red: 3, green: 0, blue: 1}",
        "red: 3, green: 0, blue: 1",
        "red=3 green=0 blue=1",
        "Red: 3\nGreen: 0\nBlue: 1",
        "- red stars: 3\n- green stars: 0\n- blue stars: 1",
    ],
)
def test_accepted_answer_forms_are_exactly_right(text):
    assert parse_answer(text) == EXPECTED
    v = verify(EXPECTED, text)
    assert v.correct is True and v.reward == 1.0 and v.predicted == EXPECTED


def test_missing_colour_is_wrong_not_zero():
    v = verify(EXPECTED, r"\boxed{red: 3, blue: 1}")  # green (truly 0) not mentioned
    assert v.predicted == {"red": 3, "blue": 1}
    assert v.correct is False
    assert v.reward == pytest.approx(2 / 3)
    assert v.per_colour == {"red": True, "green": False, "blue": True}


def test_wrong_counts_get_partial_credit():
    assert verify(EXPECTED, r"\boxed{red: 2, green: 0, blue: 1}").reward == pytest.approx(2 / 3)
    assert verify(EXPECTED, r"\boxed{red: 2, green: 1, blue: 1}").reward == pytest.approx(1 / 3)
    nothing_right = verify(EXPECTED, r"\boxed{red: 0, green: 2, blue: 3}")
    assert nothing_right.reward == 0.0 and not nothing_right.correct
    # extra colours the task does not have are ignored
    assert verify(EXPECTED, r"\boxed{red: 3, green: 0, blue: 1, purple: 9}").correct


@pytest.mark.parametrize("text", ["", "   ", "I have no idea.", r"\boxed{}", "red: 3.5", "{not json}"])
def test_garbage_parses_to_none(text):
    assert parse_answer(text) is None
    v = verify(EXPECTED, text)
    assert v.predicted is None and v.reward == 0.0 and v.correct is False


def test_score_aggregates_by_hand():
    examples = [{"counts": EXPECTED}, EXPECTED, {"counts": {"red": 1, "green": 1, "blue": 1}}]
    answers = [
        r"\boxed{red: 3, green: 0, blue: 1}",  # exact: reward 1
        r"\boxed{red: 3, green: 0, blue: 2}",  # 2 of 3: reward 2/3
        "nothing",  # reward 0
    ]
    out = score(examples, answers)
    assert out["n"] == 3
    assert out["exact_accuracy"] == pytest.approx(1 / 3)
    assert out["mean_reward"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    ex = make_example(5)
    assert score([ex], [format_answer(ex.counts)])["exact_accuracy"] == 1.0


def test_prompt_mentions_format_and_colours():
    assert "\\boxed{red: 3, green: 0, blue: 1}" in SYSTEM_PROMPT
    assert parse_answer(SYSTEM_PROMPT) == EXPECTED  # the template itself is parseable
    text = user_prompt(make_example(0))
    assert all(c in text for c in DEFAULT_CONFIG.colour_names)


# ----------------------------------------------------------------------------- export


def test_gym_row_shape_and_png_round_trip(tmp_path):
    ex = make_example(11)
    row = export.to_gym_row(ex, DEFAULT_CONFIG)
    assert set(row) >= {"responses_create_params", "stars", "counts", "agent_ref"}
    assert row["agent_ref"] == {"type": "responses_api_agents", "name": "star_count_simple_agent"}
    system, user = row["responses_create_params"]["input"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["role"] == "user"
    image, text = user["content"]
    assert image["type"] == "input_image" and image["detail"] == "auto"
    assert text == {"type": "input_text", "text": user_prompt(ex)}
    prefix = "data:image/png;base64,"
    assert image["image_url"].startswith(prefix)
    png = Image.open(io.BytesIO(base64.b64decode(image["image_url"][len(prefix) :])))
    assert png.format == "PNG" and png.size == (ex.width, ex.height)
    assert png.convert("RGB").tobytes() == render(ex).tobytes()
    assert row["counts"] == ex.counts
    assert len(row["stars"]) == sum(ex.counts.values())
    assert {"x", "y", "radius", "rotation", "colour"} <= set(row["stars"][0])
    json.dumps(row)  # JSON serialisable

    out = tmp_path / "rows.jsonl"
    assert export.write_jsonl(out, train_split(3)) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in rows] == [0, 1, 2]


def test_export_cli_heldout(tmp_path):
    out = tmp_path / "held.jsonl"
    assert export.main(["--split", "heldout", "--n", "4", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in rows] == heldout_seeds()[:4]


def test_gym_files_present_and_well_formed():
    yaml = pytest.importorskip("yaml")
    conf = yaml.safe_load((PKG_DIR / "configs" / "star_count.yaml").read_text())
    server = conf["star_count"]["resources_servers"]["star_count"]
    assert server["entrypoint"] == "app.py"
    agent = conf["star_count_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["resources_server"] == {"type": "resources_servers", "name": "star_count"}
    assert {d["type"]: d["jsonl_fpath"].rsplit("/", 1)[-1] for d in agent["datasets"]} == {
        "train": "train.jsonl",
        "validation": "validation.jsonl",
        "example": "example.jsonl",
    }
    assert "nemo-gym" in (PKG_DIR / "requirements.txt").read_text()
    # app.py is only parsed here: nemo_gym is not installed in this environment.
    tree = ast.parse((PKG_DIR / "app.py").read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    server_cls = classes["StarCountResourcesServer"]
    assert [b.id for b in server_cls.bases] == ["SimpleResourcesServer"]
    assert any(isinstance(n, ast.AsyncFunctionDef) and n.name == "verify" for n in server_cls.body)
    for line in (PKG_DIR / "data" / "example.jsonl").read_text().splitlines():
        assert set(json.loads(line)) >= {"responses_create_params", "counts", "agent_ref"}


# ----------------------------------------------------------------------------- workload


def test_search_space_baseline_and_cost():
    assert {k: v[0] for k, v in workload.SEARCH_SPACE.items()} == workload.BASELINE
    assert set(workload.BASELINE) == {"train_size", "hidden", "iters", "lr", "resolution"}
    base = workload.estimate_cost(workload.BASELINE)
    assert 0 < base < 10
    for knob in ("train_size", "hidden", "iters", "resolution"):
        bigger = {**workload.BASELINE, knob: max(workload.SEARCH_SPACE[knob])}
        assert workload.estimate_cost(bigger) > base
    assert workload.estimate_cost(workload.BASELINE, cached=True) < base


def test_cache_round_trip_and_extension(tmp_path, monkeypatch):
    monkeypatch.setenv("GOALTENDER_CACHE_DIR", str(tmp_path))
    X1, Y1 = workload.load_split("train", 12, 8)
    assert X1.shape == (12, 8, 8, 3) and X1.dtype == np.uint8 and Y1.shape == (12, 3)
    X2, Y2 = workload.load_split("train", 20, 8)  # extends the cached 12
    X3, Y3 = workload.load_split("train", 20, 8, use_cache=False)
    assert np.array_equal(X2, X3) and np.array_equal(Y2, Y3)
    assert np.array_equal(X2[:12], X1)
    X4, _ = workload.load_split("train", 5, 8)  # sliced from a cached superset
    assert np.array_equal(X4, X1[:5])
    assert not list(tmp_path.glob("*.tmp"))
    Xh, Yh = workload.load_split("heldout", 64, 8)
    assert Xh.shape[0] == 64
    assert Yh.tolist() == [[ex.counts[c] for c in DEFAULT_CONFIG.colours] for ex in heldout_split()]


def test_workload_subprocess_tiny_run(tmp_path):
    env = {**os.environ, "GOALTENDER_CACHE_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "goaltender.environments.star_count.workload"]
    cmd += ["--train-size", "80", "--hidden", "8", "--iters", "4", "--lr", "0.01", "--resolution", "8"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    progress, summary = [], {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            progress.append(json.loads(line))
        else:
            key, value = line.split(": ", 1)
            summary[key] = value
    assert progress and all("step" in p and "train_loss" in p for p in progress)
    assert progress[-1]["step"] == 4
    for key in ("exact_accuracy", "mean_reward"):
        assert 0.0 <= float(summary[key]) <= 1.0
    assert float(summary["mean_reward"]) >= float(summary["exact_accuracy"])
    assert float(summary["train_loss"]) >= 0
    assert float(summary["train_seconds"]) >= 0
    assert int(summary["train_size"]) == 80
    assert int(summary["n_heldout"]) == 64
