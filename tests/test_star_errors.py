"""Star-count error analysis (environments/star_count/errors.py): error classes, accuracy per colour
and resolution, the hardest cases; evaluate.py printing it and writing errors.json and
hard_cases.png; and `show examples` in a goal's thread posting the gallery through the fake Slack
(fetched from the runner with GetArtifact, which never follows a link the agent left)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_slack import ALICE, BOB
from helpers import write_agent
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from goaltender.bot.gallery import asks_for_examples
from goaltender.environments.star_count.errors import ERROR_CLASSES, analyse, classify
from goaltender.protocol import messages as p
from goaltender.runner.trust import goal_named

REPO_ROOT = Path(__file__).resolve().parents[1]
COLOURS = ("red", "green", "blue")


@dataclass(frozen=True)
class Ex:
    """The parts of generate.Example the analysis reads."""

    seed: int
    width: int
    counts: dict[str, int]


def ex(seed: int, width: int, red: int, green: int, blue: int) -> Ex:
    return Ex(seed, width, {"red": red, "green": green, "blue": blue})


def boxed(red: int, green: int, blue: int) -> str:
    return rf"\boxed{{red: {red}, green: {green}, blue: {blue}}}"


# ----------------------------------------------------------------------------- analyse() by hand


def test_classes_per_colour_resolution_and_hardest_by_hand():
    examples = [
        ex(0, 64, 1, 0, 2),  # right
        ex(1, 64, 3, 3, 3),  # off by one (red), 9 stars
        ex(2, 128, 2, 1, 0),  # off by more (green 1 -> 3)
        ex(3, 128, 0, 0, 1),  # format: unreadable
        ex(4, 128, 2, 2, 2),  # off by one (red and blue), 6 stars
        ex(5, 96, 1, 1, 1),  # format: blue left out
    ]
    answers = [
        boxed(1, 0, 2),
        boxed(2, 3, 3),
        boxed(2, 3, 0),
        "I cannot tell",
        boxed(3, 2, 1),
        r"\boxed{red: 1, green: 1}",
    ]
    a = analyse(examples, answers)
    assert a.n == 6 and [c.error for c in a.cases] == [
        None,
        "off_by_one",
        "off_by_more",
        "format",
        "off_by_one",
        "format",
    ]
    assert a.errors == {"format": 2, "off_by_one": 2, "off_by_more": 1}
    # ties go to the first class of ERROR_CLASSES: format, whose fix comes before any model change
    assert a.dominant == "format"
    assert a.per_colour == {"red": round(3 / 6, 4), "green": round(4 / 6, 4), "blue": 0.5}
    assert a.by_resolution == {64: 0.5, 96: 0.0, 128: 0.0}
    assert [c.index for c in a.hardest()] == [1, 4, 2, 5, 3]  # most stars, then furthest off
    assert [c.index for c in a.hardest(2)] == [1, 4]
    assert a.summary_lines() == [
        "acc/red: 0.5",
        "acc/green: 0.6667",
        "acc/blue: 0.5",
        "acc/res_64: 0.5",
        "acc/res_96: 0.0",
        "acc/res_128: 0.0",
        "errors/format: 2",
        "errors/off_by_one: 2",
        "errors/off_by_more: 1",
    ]
    assert "format" in a.text() and "prompt" in a.text() and "5 of 6" in a.text()
    saved = json.loads(json.dumps(a.to_json()))
    assert saved["dominant"] == "format" and saved["exact"] == 1 and len(saved["hardest"]) == 5
    assert saved["hardest"][0] == {
        "index": 1,
        "seed": 1,
        "resolution": 64,
        "stars": 9,
        "truth": {"red": 3, "green": 3, "blue": 3},
        "predicted": {"red": 2, "green": 3, "blue": 3},
        "error": "off_by_one",
    }


def test_dominant_off_by_one_suggests_dense_hard_cases_and_nothing_wrong_says_so():
    examples = [ex(i, 96, 3, 3, i % 2) for i in range(4)]
    a = analyse(examples, [boxed(2, 3, i % 2) for i in range(3)] + [boxed(0, 0, 0)])
    assert a.errors == {"format": 0, "off_by_one": 3, "off_by_more": 1}
    assert a.dominant == "off_by_one" and "dense" in a.text() and "hard cases" in a.text()
    right = analyse(examples, [boxed(3, 3, i % 2) for i in range(4)])
    assert right.dominant is None and right.hardest() == [] and "no errors" in right.text()
    assert analyse([], []).summary_lines() == [f"errors/{k}: 0" for k in ERROR_CLASSES]
    assert classify({"red": 1}, {"red": 1, "purple": 4}) is None  # colours the task lacks: ignored


counts = st.integers(0, 5)
pairs = st.lists(
    st.tuples(
        st.sampled_from([64, 96, 128]),
        st.tuples(counts, counts, counts),
        st.one_of(st.none(), st.tuples(counts, counts, counts)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(pairs)
def test_counts_add_up_and_classes_partition_the_wrong(rows):
    examples = [ex(i, res, *truth) for i, (res, truth, _) in enumerate(rows)]
    answers = ["no idea" if guess is None else boxed(*guess) for _, _, guess in rows]
    a = analyse(examples, answers)
    wrong = [i for i, (_, truth, guess) in enumerate(rows) if guess != truth]
    assert a.n == len(rows)
    assert sum(a.errors.values()) == len(wrong) == len(a.wrong)
    assert {c.index for c in a.wrong} == set(wrong)
    for c in a.wrong:  # exactly one class each, and the right one
        truth, guess = rows[c.index][1], rows[c.index][2]
        off = None if guess is None else max(abs(g - t) for g, t in zip(guess, truth, strict=True))
        assert c.error == ("format" if off is None else "off_by_one" if off == 1 else "off_by_more")
    for i, colour in enumerate(COLOURS if rows else ()):
        hits = sum(g is not None and g[i] == t[i] for _, t, g in rows)
        assert a.per_colour[colour] == round(hits / len(rows), 4)
    for res, acc in a.by_resolution.items():
        at = [r for r in rows if r[0] == res]
        assert acc == round(sum(g == t for _, t, g in at) / len(at), 4)
    hardest = a.hardest(len(rows))
    assert [c.stars for c in hardest] == sorted((c.stars for c in hardest), reverse=True)


def test_what_asks_for_examples():
    for ask in ("show examples", "Examples", "show me the examples!", "hard cases", "show hardest cases"):
        assert asks_for_examples(ask), ask
    for other in ("examples of lr schedules please", "show 3", "summary", "try harder cases"):
        assert not asks_for_examples(other), other


# ----------------------------------------------------------------------------- evaluate.py end to end

EVALUATE_SAYING_IMPORTS = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('imported needlessly:', *[m for m in %r if m in sys.modules], file=sys.stderr))\n"
    "runpy.run_module('goaltender.environments.star_count.evaluate', run_name='__main__')\n"
)


def test_evaluate_prints_the_analysis_and_writes_errors_json_and_the_gallery(tmp_path):
    env = {**os.environ, "GOALTENDER_CACHE_DIR": str(tmp_path / "cache")}
    run_dir = tmp_path / "run"
    train = [sys.executable, "-m", "goaltender.environments.star_count.workload"]
    train += ["--train-size", "120", "--hidden", "8", "--iters", "4", "--lr", "0.01", "--resolution", "8"]
    train += ["--save-model", str(run_dir / "model.npz")]
    trained = subprocess.run(train, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert trained.returncode == 0, trained.stderr
    # The real evaluation, saying at its exit which of what it need not import it imported
    # (numpy.random to initialise a model it loads, Pillow's plugins other than PNG's).
    needless = ("numpy.random", "PIL.JpegImagePlugin", "PIL.GifImagePlugin", "PIL.BmpImagePlugin")
    evaluate = [sys.executable, "-c", EVALUATE_SAYING_IMPORTS % (needless,)]
    proc = subprocess.run(
        evaluate,
        capture_output=True,
        text=True,
        env={**env, "GOALTENDER_EXPERIMENT_DIR": str(run_dir)},
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[-1] == "imported needlessly:"
    lines = proc.stdout.splitlines()
    # The headline lines come first, exactly as before.
    assert [line.split(": ")[0] for line in lines[:3]] == ["exact_accuracy", "mean_reward", "n_heldout"]
    assert lines[2] == "n_heldout: 64"
    summary = dict(line.split(": ", 1) for line in lines)
    for name in ("acc/red", "acc/green", "acc/blue", "acc/res_64", "acc/res_96", "acc/res_128"):
        assert 0.0 <= float(summary[name]) <= 1.0, name
    errors = {k: int(summary[f"errors/{k}"]) for k in ERROR_CLASSES}
    wrong = round(64 * (1 - float(summary["exact_accuracy"])))
    assert sum(errors.values()) == wrong
    saved = json.loads((run_dir / "errors.json").read_text())
    assert saved["errors"] == errors and saved["n"] == 64
    assert saved["dominant"] in (*ERROR_CLASSES, None) and saved["text"]
    assert len(saved["hardest"]) == min(8, wrong)
    with Image.open(run_dir / "hard_cases.png") as img:
        img.load()
        assert img.format == "PNG" and img.width > 300 and img.height > 150
    assert not [path for path in run_dir.iterdir() if ".tmp" in path.name]


# ----------------------------------------------------------------------------- the thread command


def _png(path: Path) -> bytes:
    Image.new("RGB", (40, 30), (200, 30, 30)).save(path, format="PNG")
    return path.read_bytes()


def _agent(tmp_path: Path, png: bytes, outside: Path) -> list[str]:
    """Goal 1's experiment leaves a gallery and an analysis; goal 2's plants a link to a PNG
    outside its workspace in the gallery's place. (Experiments run sandboxed, without the test's
    temporary files: the bytes travel in the command.)"""
    analysis = json.dumps({"text": "the dominant error is **off by one** <on dense canvases>"}).encode()
    d = '"$GOALTENDER_EXPERIMENT_DIR"'
    writes = (
        f"echo {base64.b64encode(png).decode()} | base64 -d > {d}/hard_cases.png && "
        f"echo {base64.b64encode(analysis).decode()} | base64 -d > {d}/errors.json && echo acc: 0.5"
    )
    plants = f"ln -s {outside} {d}/hard_cases.png && echo acc: 0.4"
    return write_agent(
        tmp_path,
        "agent.sh",
        f"""
if [ "$GOALTENDER_GOAL_ID" = 1 ]; then
  goaltender experiment -d base --metric acc -- sh -c '{writes}'
else
  goaltender experiment -d base --metric acc -- sh -c '{plants}'
fi
goaltender milestone "ran" "one experiment"
sleep 120
""",
    )


async def test_show_examples_posts_the_gallery_and_a_planted_link_is_refused(
    fake, make_bot, start_runner, connect, tmp_path
):
    png = _png(tmp_path / "gallery.png")
    outside = tmp_path / "outside.png"
    _png(outside)
    runner = await start_runner(agents={"agent": _agent(tmp_path, png, outside)}, default_agent="agent")
    await make_bot(runner.settings.socket_path)
    general = fake.general
    await fake.slash_command("/goal", "find a good lr, max 3 experiments", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1", timeout=15)
    await fake.wait_for_message(general, thread_ts=card.ts, text="ran", timeout=60)

    # Anyone may ask; the gallery of the best experiment is uploaded in the thread with the analysis.
    await fake.user_replies(general, card.ts, "show examples", user=BOB)

    def uploaded(root: str) -> list:  # (the milestone's campaign plot is a file too)
        return [m for m in fake.messages(general, root) if m.files and "Hard cases" in m.text]

    [posted] = await fake.wait_for(lambda: uploaded(card.ts), 30)
    assert fake.files[posted.files[0]["id"]].content == png
    assert "Hard cases of goal #1's best experiment, #1" in posted.text
    assert "*off by one*" in posted.text and "&lt;on dense canvases&gt;" in posted.text
    assert await runner.store.read_inbox(1, unread_only=False) == []  # not sent to the agent

    # Goal 2's gallery is a link out of its workspace: the runner will not read through it.
    await fake.slash_command("/goal", "find a good lr too, max 3 experiments", general, ALICE)
    second = await fake.wait_for_message(general, text="Goal #2", timeout=15)
    await fake.wait_for_message(general, thread_ts=second.ts, text="ran", timeout=60)
    [experiment] = await runner.store.experiments(2)
    assert (Path(experiment.log_path).parent / "hard_cases.png").is_symlink()
    client = await connect(runner)
    with pytest.raises(p.ProtocolError) as refused:
        await client.request(p.GetArtifact(experiment_id=experiment.id, name="hard_cases.png"))
    assert refused.value.error.code == "not_found"
    await fake.user_replies(general, second.ts, "examples", user=BOB)
    [told] = await fake.wait_for(lambda: [e for e in fake.ephemerals(BOB) if e.thread_ts == second.ts], 30)
    assert "No experiment of goal #2 has a gallery" in told.text
    assert not uploaded(second.ts)

    # The same read works for goal 1's, and the name is held to the fixed list.
    [first] = await runner.store.experiments(1)
    reply = await client.request(p.GetArtifact(experiment_id=first.id, name="hard_cases.png"))
    assert base64.b64decode(reply.data) == png
    other = p.parse_request(b'{"type": "get_artifact", "id": 1, "experiment_id": 1, "name": "model.pkl"}')
    assert isinstance(other, p.Error) and other.code == "bad_request"
    # An agent may read its own goal's artifacts only (GOAL_READS + the experiment's goal).
    request = p.GetArtifact(id=1, experiment_id=experiment.id, name="errors.json")
    assert await goal_named(request, runner.store) == 2


def test_the_report_names_the_dominant_error_class():
    # The evaluation's `errors/<class>` lines, as the runner keeps them in the row's metrics.
    from goaltender.runner.report import error_classes, summary_text
    from goaltender.storage.records import Experiment, Goal, utcnow
    from goaltender.storage.runner_rows import Ledger

    a = analyse(
        [ex(1, 64, 3, 3, 3), ex(4, 128, 2, 2, 2), ex(2, 128, 2, 1, 0)],
        [boxed(2, 3, 3), boxed(3, 2, 1), boxed(2, 3, 0)],
    )
    metrics = {name: float(value) for name, value in (line.split(": ") for line in a.summary_lines())}
    best = Experiment(
        id=1, goal_id=1, index=1, description="d", command=["x"], status="keep",
        metric_name="exact_accuracy", metric_value=0.0, metrics=metrics, verified=True,
    )  # fmt: skip
    assert error_classes(best) == "off_by_one 2 (dominant), off_by_more 1, format 0"
    report = summary_text(Goal(id=1, text="count stars"), [best], Ledger(attempted=1, best=best), utcnow())
    assert "**Errors of the best:** off_by_one 2 (dominant)" in report


AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


async def test_a_secret_escaped_in_errors_json_never_reaches_slack(
    fake, make_bot, start_runner, connect, tmp_path, monkeypatch
):
    """errors.json with the runner's secret written with `\\/` and one `\\u`-escaped letter (as
    PHP's json_encode, or an agent, writes it) passed the runner's redaction, and the bot decoded
    the JSON and posted the secret in the gallery's comment. Nothing Slack gets holds it now."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)  # the runner's, not granted to goals
    png = _png(tmp_path / "gallery.png")
    escaped = AWS_SECRET.replace("/", "\\/").replace("EXAMPLE", "EX\\u0041MPLE")
    analysis = ('{"text": "off by one; the key is ' + escaped + '", "\\u006bey": "' + escaped + '"}').encode()
    assert json.loads(analysis)["text"].endswith(AWS_SECRET)
    d = '"$GOALTENDER_EXPERIMENT_DIR"'
    writes = (
        f"echo {base64.b64encode(png).decode()} | base64 -d > {d}/hard_cases.png && "
        f"echo {base64.b64encode(analysis).decode()} | base64 -d > {d}/errors.json && echo acc: 0.5"
    )
    script = f"goaltender experiment -d base --metric acc -- sh -c '{writes}'\ngoaltender milestone ran\nsleep 120\n"
    runner = await start_runner(
        agents={"agent": write_agent(tmp_path, "agent.sh", script)}, default_agent="agent"
    )
    await make_bot(runner.settings.socket_path)
    general = fake.general
    await fake.slash_command("/goal", "find a good lr, max 3 experiments", general, ALICE)
    card = await fake.wait_for_message(general, text="Goal #1", timeout=15)
    await fake.wait_for_message(general, thread_ts=card.ts, text="ran", timeout=60)
    await fake.user_replies(general, card.ts, "show examples", user=BOB)
    [posted] = await fake.wait_for(
        lambda: [m for m in fake.messages(general, card.ts) if m.files and "Hard cases" in m.text], 30
    )
    assert "off by one; the key is [redacted:AWS_SECRET_ACCESS_KEY]" in posted.text
    assert fake.files[posted.files[0]["id"]].content == png  # the picture, as it was
    sent = json.dumps([call.params for call in fake.calls()]) + posted.text
    assert AWS_SECRET not in sent and AWS_SECRET.replace("/", "\\/") not in sent and "bPxRfiCYEX" not in sent
