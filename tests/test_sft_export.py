"""SFT data for NeMo RL (openai_format rows, splits) and the token preflight that guards against
NeMo RL's silent masking of over-long examples."""

from __future__ import annotations

import argparse
import base64
import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from goaltender import cli
from goaltender.environments import preflight
from goaltender.environments.star_count import export
from goaltender.environments.star_count.generate import (
    DEFAULT_CONFIG,
    HELDOUT_SIZE,
    heldout_seeds,
    make_example,
    render,
    train_seeds,
    validation_seeds,
)
from goaltender.environments.star_count.prompt import SYSTEM_PROMPT, format_answer, user_prompt
from goaltender.environments.star_count.verify import verify

OVERLAY = Path(export.__file__).parent / "configs" / "sft_qwen3_vl_2b.yaml"
DATA_URL = "data:image/png;base64,"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def png_data_url(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (255, 255, 255)).save(buf, format="PNG")
    return DATA_URL + base64.b64encode(buf.getvalue()).decode("ascii")


@pytest.fixture(scope="module")
def small_export(tmp_path_factory) -> Path:
    """train 32 / validation 8 / the fixed held-out 64, as SFT rows."""
    out = tmp_path_factory.mktemp("sft")
    assert export.export_splits(out, 32, 8, "sft") == {"train": 32, "validation": 8, "heldout": HELDOUT_SIZE}
    return out


# ----------------------------------------------------------------------------- rows


def test_sft_row_is_openai_format_with_the_verifiers_answer():
    ex = make_example(7)
    row = json.loads(json.dumps(export.to_sft_row(ex)))  # survives JSON
    system, user, assistant = row["messages"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["role"] == "user"
    image, text = user["content"]
    # NeMo RL's VLM message code looks for {"type": "image", "image": <path or data URL>}.
    assert image["type"] == "image" and image["image"].startswith(DATA_URL)
    png = Image.open(io.BytesIO(base64.b64decode(image["image"][len(DATA_URL) :])))
    assert png.size == (ex.width, ex.height)
    assert png.convert("RGB").tobytes() == render(ex).tobytes()
    assert text == {"type": "text", "text": user_prompt(ex)}
    assert assistant == {"role": "assistant", "content": format_answer(ex.counts)}
    assert row["seed"] == 7 and row["counts"] == ex.counts


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=0, max_value=400_000))
def test_every_assistant_answer_gets_full_reward(seed):
    row = export.to_sft_row(make_example(seed))
    verdict = verify(row["counts"], row["messages"][-1]["content"])
    assert verdict.correct and verdict.reward == 1.0


def test_exported_splits_are_sized_disjoint_and_verify(small_export):
    splits = {name: read_jsonl(small_export / f"{name}.jsonl") for name in export.SPLITS}
    seeds = {name: [row["seed"] for row in rows] for name, rows in splits.items()}
    assert seeds["train"] == train_seeds(32)
    assert seeds["validation"] == validation_seeds(8)
    assert seeds["heldout"] == heldout_seeds()
    assert not set(seeds["train"]) & set(seeds["validation"])
    assert not (set(seeds["train"]) | set(seeds["validation"])) & set(seeds["heldout"])
    for rows in splits.values():
        for row in rows:
            assert row["counts"] == make_example(row["seed"]).counts
            assert verify(row["counts"], row["messages"][-1]["content"]).reward == 1.0


def test_reference_shapes_never_reach_the_heldout_seeds():
    for train, validation in export.REFERENCE_SHAPES:
        assert max(validation_seeds(validation)) < min(heldout_seeds())
        assert max(train_seeds(train)) < min(validation_seeds(validation))
    # A smaller validation split is a prefix of a larger one (2048/256 inside 4096/512).
    assert validation_seeds(256) == validation_seeds(512)[:256]
    with pytest.raises(ValueError):
        train_seeds(10, start=499_995)


def test_heldout_is_the_same_64_every_time(small_export, tmp_path):
    again = tmp_path / "again"
    export.export_splits(again, 2, 1, "sft")
    assert (again / "heldout.jsonl").read_bytes() == (small_export / "heldout.jsonl").read_bytes()
    assert [r["seed"] for r in read_jsonl(again / "heldout.jsonl")] == heldout_seeds()


def test_export_cli_shapes_and_single_splits(tmp_path, capsys):
    assert export.main(["--format", "sft", "--shape", "6/3", "--out-dir", str(tmp_path / "a")]) == 0
    assert (
        export.main(
            ["--format", "sft", "--train", "6", "--validation", "3", "--out-dir", str(tmp_path / "b")]
        )
        == 0
    )
    for name in export.SPLITS:
        assert (tmp_path / "a" / f"{name}.jsonl").read_bytes() == (
            tmp_path / "b" / f"{name}.jsonl"
        ).read_bytes()
    assert [len(read_jsonl(tmp_path / "a" / f"{n}.jsonl")) for n in export.SPLITS] == [6, 3, 64]

    # Gym rows: the validation split, and every split at once, for configs/star_count.yaml.
    out = tmp_path / "val.jsonl"
    assert export.main(["--split", "validation", "--n", "4", "--out", str(out)]) == 0
    rows = read_jsonl(out)
    assert [r["seed"] for r in rows] == validation_seeds(4)
    assert all(r["agent_ref"]["name"] == export.AGENT_NAME for r in rows)
    assert export.main(["--format", "gym", "--shape", "3/2", "--out-dir", str(tmp_path / "gym")]) == 0
    assert [r["seed"] for r in read_jsonl(tmp_path / "gym" / "validation.jsonl")] == validation_seeds(2)
    assert "responses_create_params" in read_jsonl(tmp_path / "gym" / "train.jsonl")[0]

    for bad in (
        ["--shape", "2048", "--out-dir", str(tmp_path)],
        ["--shape", "4/2", "--train", "4", "--out-dir", str(tmp_path)],
        ["--split", "train", "--out", str(out)],  # train needs --n
        ["--split", "train", "--n", "2", "--out", str(out), "--images", "files"],  # gym rows inline only
        [],
    ):
        with pytest.raises(SystemExit) as exc:
            export.main(bad)
        assert exc.value.code == 2
    capsys.readouterr()


def test_image_files_mode_writes_pngs_by_absolute_path(tmp_path):
    assert (
        export.main(["--format", "sft", "--shape", "2/1", "--images", "files", "--out-dir", str(tmp_path)])
        == 0
    )
    row = read_jsonl(tmp_path / "train.jsonl")[1]
    image = Path(row["messages"][1]["content"][0]["image"])
    assert image.is_absolute() and image == (tmp_path / "images" / "1.png").resolve()
    assert Image.open(image).convert("RGB").tobytes() == render(make_example(1)).tobytes()
    counter = preflight.EstimateCounter()
    assert counter.count(row) == counter.count(export.to_sft_row(make_example(1)))


# ----------------------------------------------------------------------------- the estimate


def test_image_tokens_are_the_processors_arithmetic():
    """Qwen3-VL's processor (patch 16, merge 2): an image costs (resized side / 32) squared pads
    and its two markers. The estimate used to double the pads (a serving-side count of another
    model): 130 per star-count canvas where the processor gives 66."""
    # Star-count canvases are scaled up to min_pixels (256 x 256): 8 * 8 pads each.
    for side in DEFAULT_CONFIG.resolutions:
        assert preflight.image_tokens(side, side, preflight.QWEN3_VL) == 64 + 2
    assert preflight.image_tokens(288, 288) == 9 * 9 + 2  # over min_pixels: as it is
    assert preflight.image_tokens(300, 300) == 9 * 9 + 2  # 300 rounds to 288
    assert preflight.image_tokens(640, 480) == 20 * 15 + 2
    assert preflight.image_tokens(1000, 1000) == 31 * 31 + 2  # 1000 rounds to 992
    assert preflight.image_tokens(2000, 2000) == 62 * 62 + 2  # 62.5 rounds to even, as Python's round
    assert preflight.image_tokens(1000, 1000, preflight.QWEN2_5_VL) == 36 * 36 + 2  # 28 px: 1008


def test_the_real_export_counts_exactly(small_export, capsys):
    """Seed 0's row: system 139 + user text 47 + answer 11 (3 bytes a token, rounded up), its
    96 px canvas 66, 5 a message for the chat template's framing."""
    row = read_jsonl(small_export / "train.jsonl")[0]
    assert row["seed"] == 0 and make_example(0).width == 96
    assert preflight.EstimateCounter().count(row) == 139 + 47 + 11 + 66 + 3 * 5 == 278
    argv = ["--data", str(small_export / "train.jsonl"), "--max-seq-len", "1024", "--estimate"]
    assert preflight.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "train.jsonl: n=32 max=279 p95=279 over_limit=0 (limit 1024; estimate (qwen3-vl geometry))",
        "image tokens per canvas (qwen3-vl: patch 16, merge 2, 65,536-16,777,216 pixels; pads + 2 "
        "markers): 64x64: 66, 96x96: 66, 128x128: 66",
    ]


def test_drop_at_a_tight_limit_keeps_the_rows_that_fit(small_export, tmp_path, capsys):
    """Every train row is 278 or 279 tokens: at a limit of 280 all fit (the doubled image estimate
    made them 342 and 343, and --drop dropped every one)."""
    argv = ["--data", str(small_export / "train.jsonl"), "--max-seq-len", "280", "--estimate"]
    assert preflight.main([*argv, "--drop", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"train.jsonl: dropped 0 of 32; wrote 32 rows to {tmp_path / 'train.filtered.jsonl'}" in out
    assert (tmp_path / "train.filtered.jsonl").read_text() == (small_export / "train.jsonl").read_text()
    at_279 = ["--data", str(small_export / "train.jsonl"), "--max-seq-len", "279", "--estimate"]
    assert preflight.main(at_279) == 1  # the 279s would be masked (NeMo RL masks at >=)


def test_the_geometry_comes_from_the_models_own_config(tmp_path, monkeypatch):
    """preprocessor_config.json, in a model directory or the hub cache's snapshot, as
    transformers reads it: min_pixels/max_pixels over size's shortest and longest edge."""
    model = tmp_path / "my-vl"
    model.mkdir()
    config = {"patch_size": 14, "merge_size": 2, "min_pixels": 200_704, "size": {"longest_edge": 1_003_520}}
    (model / "preprocessor_config.json").write_text(json.dumps(config))
    geometry = preflight.geometry_for(str(model))
    assert (geometry.patch, geometry.merge, geometry.min_pixels, geometry.max_pixels) == (
        14,
        2,
        200_704,
        1_003_520,
    )
    assert preflight.image_tokens(64, 64, geometry) == 16 * 16 + 2  # scaled up to 448 x 448

    # Qwen3-VL-2B-Instruct's, as `goaltender fetch` leaves it in the cache.
    cache = tmp_path / "hub"
    repo = cache / "models--Qwen--Qwen3-VL-2B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    qwen3 = {"patch_size": 16, "merge_size": 2, "size": {"longest_edge": 16777216, "shortest_edge": 65536}}
    (repo / "snapshots" / "abc123" / "preprocessor_config.json").write_text(json.dumps(qwen3))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    found = preflight.geometry_for("Qwen/Qwen3-VL-2B-Instruct")
    assert found.name == "Qwen/Qwen3-VL-2B-Instruct's preprocessor_config.json"
    assert (found.patch, found.merge, found.min_pixels, found.max_pixels) == (16, 2, 65_536, 16_777_216)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert preflight.geometry_for("Qwen/Qwen3-VL-2B-Instruct") is preflight.QWEN3_VL  # known by name


def test_processor_geometry_by_hand():
    # Qwen3-VL: 32 px per token; 1000 px rounds to 992 = 31 * 32.
    assert preflight.grid_tokens(1000, 1000, preflight.QWEN3_VL) == 31 * 31
    # Small canvases are scaled up to min_pixels (256 x 256): every star-count canvas costs 64.
    for side in DEFAULT_CONFIG.resolutions:
        assert preflight.grid_tokens(side, side, preflight.QWEN3_VL) == 64
    # Qwen2.5-VL: 28 px per token; 1000 px rounds to 1008 = 36 * 28.
    assert preflight.grid_tokens(1000, 1000, preflight.QWEN2_5_VL) == 36 * 36
    assert preflight.geometry_for("Qwen/Qwen2.5-VL-3B-Instruct") is preflight.QWEN2_5_VL
    assert preflight.geometry_for("Qwen/Qwen3-VL-2B-Instruct") is preflight.QWEN3_VL


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=16, max_value=6000),
    st.integers(min_value=16, max_value=6000),
    st.sampled_from([preflight.QWEN3_VL, preflight.QWEN2_5_VL]),
)
def test_smart_resize_lands_on_the_grid_within_the_pixel_budget(height, width, geometry):
    side = geometry.pixels_per_token_side
    h, w = preflight.smart_resize(height, width, side, geometry.min_pixels, geometry.max_pixels)
    assert h % side == 0 and w % side == 0
    assert h * w <= geometry.max_pixels
    if max(height, width) <= 4 * min(height, width):  # extreme aspect ratios may round under
        assert h * w >= geometry.min_pixels
    assert abs(h / w - height / width) <= max(height, width) / min(height, width) * 0.6


# ----------------------------------------------------------------------------- the preflight


def oversized_file(tmp_path: Path) -> tuple[Path, list[str]]:
    """Three ordinary rows and one with a 2000x2000 canvas in the middle (line 3)."""
    rows = [export.to_sft_row(make_example(seed)) for seed in range(3)]
    huge = export.to_sft_row(make_example(3), image=png_data_url(2000, 2000))
    lines = [json.dumps(r) for r in (rows[0], rows[1], huge, rows[2])]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, lines


def test_preflight_refuses_an_oversized_example(tmp_path, capsys):
    path, _ = oversized_file(tmp_path)
    code = preflight.main(["--data", str(path), "--max-seq-len", "1024", "--estimate"])
    out, err = capsys.readouterr()
    assert code == 1
    assert out.startswith("train.jsonl: n=4 max=") and "over_limit=1 (limit 1024" in out
    assert "REFUSED" in err and "1 of 4 examples have >= 1024 tokens" in err
    assert (
        "line 3 (seed 3): 4058 tokens" in err
    )  # 62 * 62 + 2 for its 2000 px canvas, 212 of text and framing
    assert "zero loss" in err and "--drop" in err
    assert not (tmp_path / "train.filtered.jsonl").exists()


def test_preflight_drop_writes_the_rest_and_says_why(tmp_path, capsys):
    path, lines = oversized_file(tmp_path)
    code = preflight.main(["--data", str(path), "--max-seq-len", "1024", "--estimate", "--drop"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "dropped 1 of 4 (>= 1024 tokens: line 3 (seed 3)" in out
    kept = (tmp_path / "train.filtered.jsonl").read_text().splitlines()
    assert kept == [lines[0], lines[1], lines[3]]  # byte for byte
    # A limit nothing fits under leaves nothing to write: refused.
    assert preflight.main(["--data", str(path), "--max-seq-len", "5", "--estimate", "--drop"]) == 1


def test_preflight_limit_is_inclusive_as_nemo_rls(tmp_path, capsys):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(export.to_sft_row(make_example(0))) + "\n")
    tokens = preflight.EstimateCounter().count(json.loads(path.read_text()))
    assert preflight.main(["--data", str(path), "--max-seq-len", str(tokens), "--estimate"]) == 1
    assert preflight.main(["--data", str(path), "--max-seq-len", str(tokens + 1), "--estimate"]) == 0
    out, _ = capsys.readouterr()
    assert f"one.jsonl: n=1 max={tokens} p95={tokens} over_limit=0" in out


def test_preflight_summary_per_split_through_the_cli(small_export, capsys):
    paths = [str(small_export / f"{name}.jsonl") for name in export.SPLITS]
    argv = ["preflight", "--max-seq-len", "1024", "--estimate"]
    for p in paths:
        argv += ["--data", p]
    assert cli.main(argv) == 0
    *lines, canvases = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["train.jsonl", "validation.jsonl", "heldout.jsonl"]
    assert lines[0].startswith("train.jsonl: n=32 ") and lines[2].startswith("heldout.jsonl: n=64 ")
    assert all("over_limit=0" in line for line in lines)
    assert canvases.startswith("image tokens per canvas (qwen3-vl: ") and canvases.endswith("128x128: 66")


def test_preflight_bad_input_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\nnot json\n')
    assert preflight.main(["--data", str(bad), "--max-seq-len", "100", "--estimate"]) == 2
    assert "bad.jsonl:2: not JSON" in capsys.readouterr().err
    assert preflight.main(["--data", str(tmp_path / "missing.jsonl"), "--max-seq-len", "100"]) == 2


class FakeProcessor:
    """Stands in for a Qwen-VL processor: one token per character plus 10 per image."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert tokenize is False
        return "".join(
            "<img>" if part["type"] == "image" else part["text"] for m in messages for part in m["content"]
        )

    def __call__(self, text, images=None):
        return {"input_ids": [[0] * (len(text[0]) - 5 * len(images or []) + 10 * len(images or []))]}


def test_processor_counts_when_available_and_the_estimate_says_why_not():
    row = export.to_sft_row(make_example(0))
    counter, note = preflight.make_counter("some/model", loader=lambda _model: FakeProcessor())
    assert isinstance(counter, preflight.ProcessorCounter) and not note
    text = SYSTEM_PROMPT + user_prompt(make_example(0)) + format_answer(make_example(0).counts)
    assert counter.count(row) == len(text) + 10

    def missing(_model):
        raise ImportError("no transformers")

    def not_local(_model):
        raise OSError("We couldn't connect to 'https://huggingface.co'\nmore")

    counter, note = preflight.make_counter("some/model", loader=missing)
    assert isinstance(counter, preflight.EstimateCounter) and "not installed" in note
    counter, note = preflight.make_counter("some/model", loader=not_local)
    assert isinstance(counter, preflight.EstimateCounter)
    assert note.startswith("some/model is not available locally (We couldn't connect")

    def broken(_model):
        raise KeyError("qwen3_vl")

    counter, note = preflight.make_counter("some/model", loader=broken)
    assert isinstance(counter, preflight.EstimateCounter) and "did not load (KeyError" in note
    counter, note = preflight.make_counter("some/model", estimate_only=True, loader=missing)
    assert isinstance(counter, preflight.EstimateCounter) and not note


# ----------------------------------------------------------------------------- the overlay


def test_overlay_limit_clears_the_preflight_max_for_every_resolution():
    yaml = pytest.importorskip("yaml")
    conf = yaml.safe_load(OVERLAY.read_text())
    policy = conf["policy"]
    assert policy["model_name"] == "Qwen/Qwen3-VL-2B-Instruct"
    counter = preflight.EstimateCounter(preflight.geometry_for(policy["model_name"]))
    worst = [counter.count(row) for row in export.worst_case_sft_rows(DEFAULT_CONFIG)]
    assert len(worst) == len(DEFAULT_CONFIG.resolutions)
    assert policy["max_total_sequence_length"] > max(worst)  # NeMo RL masks at >=

    sft, ckpt, data = conf["sft"], conf["checkpointing"], conf["data"]
    assert sft["max_num_steps"] == 320
    smallest_train = min(train for train, _ in export.REFERENCE_SHAPES)
    assert sft["max_num_epochs"] * (smallest_train // policy["train_global_batch_size"]) >= 320
    assert ckpt["metric_name"].startswith("val:") and ckpt["keep_top_k"] >= 1
    assert ckpt["save_period"] % sft["val_period"] == 0
    assert data["_override_"] is True
    for split in ("train", "validation"):
        assert data[split]["dataset_name"] == "openai_format"
        assert data[split]["use_preserving_dataset"] is True
        assert data[split]["data_path"].endswith(f"{split}.jsonl")


def test_worst_case_rows_bound_the_real_ones(small_export):
    counter = preflight.EstimateCounter()
    worst = max(counter.count(row) for row in export.worst_case_sft_rows(DEFAULT_CONFIG))
    report = preflight.check_file(small_export / "train.jsonl", 10_000, counter)
    assert report.max_tokens <= worst


def test_run_rejects_a_nonpositive_limit(tmp_path, capsys):
    args = argparse.Namespace(
        data=[tmp_path / "x.jsonl"], max_seq_len=0, model=None, estimate=True, drop=False, out_dir=None
    )
    assert preflight.run(args) == 2
    assert "--max-seq-len" in capsys.readouterr().err
