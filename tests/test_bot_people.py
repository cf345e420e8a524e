"""People in a goal's thread, through the real bot, a real runner and the fake Slack: the runner
and the agent hear of people by name (not `slack:U…`), talk between people stays talk, steering
is explicit (`steer: …` or an @mention of the bot), a 🛑 on the card stops the goal for those who
may, and files attached in the thread land in the goal's inputs/ (or get a note saying why not)."""

from __future__ import annotations

from pathlib import Path

from fake_slack import ALICE, BOB
from helpers import blocks_text, eventually, write_agent

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient

ALICE_NAME = "Alice Liddell"
PDF = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj << /Type /Catalog >> endobj\ntrailer << >>\n%%EOF\n"


async def started_goal(fake, make_bot, start_runner, tmp_path, **bot_settings):
    """A runner with a sleeping agent, the bot, and goal #1 started by Alice: (bot, runner, card)."""
    fake.users[ALICE].name = ALICE_NAME  # users.info's display_name
    agent = write_agent(tmp_path, "sleepy.sh", "sleep 120\n")
    runner = await start_runner(agents={"sleepy": agent}, default_agent="sleepy")
    bot = await make_bot(runner.settings.socket_path, **bot_settings)
    res = await fake.slash_command("/goal", "tune the lr, budget 1h", fake.general, ALICE)
    assert "goal #1" in (await res.wait_for_ephemeral(timeout=10)).text.lower()
    card = await fake.wait_for_message(fake.general, text="Goal #1")
    return bot, runner, card


async def agents_inbox(runner, goal_id: int = 1) -> list[p.InboxMessage]:
    """What the goal's agent reads from its own socket (the ReadInbox verb): every message not read yet."""
    sock = runner.settings.agent_socket(goal_id)
    await eventually(sock.exists)
    client = await RunnerClient.connect_unix(sock, client="agent")
    try:
        reply = await client.request(p.ReadInbox(goal_id=goal_id))
    finally:
        await client.close()
    return reply.messages


async def test_people_are_named_talk_stays_talk_and_steering_is_explicit(
    fake, make_bot, start_runner, tmp_path
):
    bot, runner, card = await started_goal(fake, make_bot, start_runner, tmp_path)
    general = fake.general

    # The team talks in the thread: nothing reaches the agent, nobody is refused or reacted to.
    talk = [
        await fake.user_replies(general, card.ts, "did you see the loss curve?", user=BOB),
        await fake.user_replies(general, card.ts, "yes, I think the lr is too high", user=ALICE),
        await fake.user_replies(general, card.ts, "+1, agreed", user=BOB),
    ]
    # An @mention of the bot is steering, and so is `steer: …` (its prefix is not sent).
    mentioned = await fake.user_mentions_bot(general, "try a lower lr", user=ALICE, thread_ts=card.ts)
    prefixed = await fake.user_replies(general, card.ts, "steer: use a cosine schedule", user=ALICE)
    for steer in (mentioned, prefixed):
        await fake.wait_for(lambda s=steer: fake.message(general, s.ts).reacted("eyes", fake.bot_user_id), 10)
    await eventually(bot.outbox.idle)
    assert all(fake.message(general, m.ts).reactions == {} for m in talk)
    assert [e for e in fake.ephemerals() if e.thread_ts] == []  # (the /goal answer is not in the thread)

    inbox = await agents_inbox(runner)
    assert [(m.author, m.text) for m in inbox] == [
        (ALICE_NAME, "try a lower lr"),
        (ALICE_NAME, "use a cosine schedule"),
    ]
    # In Slack the bot shows her as a mention again (Slack shows her name), never as an id.
    posted = await fake.wait_for_message(
        general, thread_ts=card.ts, text=f"Steer from <@{ALICE}>", timeout=10
    )
    assert "slack:" not in blocks_text(posted)
    # The runner's audit trail keeps the exact id, and who vouched for it.
    audit = await runner.store.audit_entries(1)
    steers = [e for e in audit if e.action == "steer"]
    assert steers and all(e.actor.startswith(f"slack:{ALICE} ({ALICE_NAME}) via ") for e in steers)
    assert (await runner.store.get_goal(1)).owner == ALICE_NAME


async def test_a_stop_sign_on_the_card_stops_the_goal_for_those_who_may(
    fake, make_bot, start_runner, tmp_path
):
    _, runner, card = await started_goal(fake, make_bot, start_runner, tmp_path)
    general = fake.general

    # Bob may not stop Alice's goal: told privately in the thread, as a `stop` reply would be.
    await fake.user_reacts(general, card.ts, "octagonal_sign", user=BOB)
    told = (await fake.wait_for(lambda: fake.ephemerals(BOB), 10))[0]
    assert told.thread_ts == card.ts
    assert "can stop goal #1; nothing changed" in told.text and f"<@{ALICE}>" in told.text
    by_verb = await fake.user_replies(general, card.ts, "stop", user=BOB)
    await fake.wait_for(lambda: len(fake.ephemerals(BOB)) == 2, 10)
    assert fake.ephemerals(BOB)[1].text == told.text
    assert fake.message(general, by_verb.ts).reactions == {}
    assert (await runner.store.get_goal(1)).state == "running"

    # Alice's 🛑 stops it; everything written about it names her.
    await fake.user_reacts(general, card.ts, "octagonal_sign", user=ALICE)
    await eventually(lambda: _state(runner, "stopped"))
    goal = await runner.store.get_goal(1)
    assert goal.end_reason == f"stopped by {ALICE_NAME}"
    await fake.wait_for(lambda: "stopped" in blocks_text(fake.message(general, card.ts)), 10)
    report = await fake.wait_for_message(general, thread_ts=card.ts, text="Final report", timeout=30)
    assert f"stopped by <@{ALICE}>" in report.text and "slack:U" not in blocks_text(report)
    assert all("slack:U" not in blocks_text(m) for m in fake.thread(general, card.ts))


async def _state(runner, state: str) -> bool:
    return (await runner.store.get_goal(1)).state == state


async def test_files_in_the_thread_land_in_inputs_or_are_refused_with_a_note(
    fake, make_bot, start_runner, tmp_path
):
    bot, runner, card = await started_goal(fake, make_bot, start_runner, tmp_path, max_file_mb=2)
    general = fake.general
    workspace = Path((await runner.store.get_goal(1)).workspace)
    inputs = workspace / "inputs"

    def about_files(msg) -> bool:
        return "in goal #1's workspace" in msg.text or "Not given to goal #1" in msg.text

    async def note_for(msg) -> str:
        """The bot's note in the thread about the files of `msg` (it answers each message once)."""
        note = await fake.wait_for_message(
            general, thread_ts=card.ts, where=about_files, timeout=20, after=msg.ts
        )
        return note.text

    # A paper (over one PutInput chunk) and notes: in inputs/, and the agent is told where.
    paper = PDF + b"%" + b"x" * (700 * 1024) + b"\n%%EOF\n"
    shared = await fake.user_shares_file(general, card.ts, "Attention Is All You Need.pdf", paper, user=ALICE)
    said = await note_for(shared)
    assert "inputs/Attention_Is_All_You_Need.pdf" in said and "the agent was told" in said
    assert (inputs / "Attention_Is_All_You_Need.pdf").read_bytes() == paper
    notes = await fake.user_shares_file(
        general, card.ts, "notes.md", "# Try\n- lr 3e-4 ✓\n".encode(), user=ALICE
    )
    assert "inputs/notes.md" in await note_for(notes)
    told = [m.text for m in await agents_inbox(runner)]
    assert any("inputs/Attention_Is_All_You_Need.pdf" in t and ALICE_NAME in t for t in told)
    assert any("inputs/notes.md" in t for t in told) and all("slack:" not in t for t in told)

    # Too big, not what its name says, neither PDF nor text, a name with folders: a note each.
    refused = {
        "huge.pdf": (PDF + b"0" * (2 * 1024 * 1024), "goals take files up to 2.0 MB"),
        "fake.pdf": (b"just text, not a PDF\n", "is named a PDF but is not one"),
        "weights.bin": (b"\x00\x01\x02\xff" * 64, "neither a PDF nor text"),
        "../../escape.txt": (b"out of the workspace\n", "is not a plain file name"),
    }
    for name, (content, why) in refused.items():
        msg = await fake.user_shares_file(general, card.ts, name, content, user=ALICE)
        said = await note_for(msg)
        assert "Not given to goal #1" in said and why in said, said
    assert sorted(f.name for f in inputs.iterdir()) == ["Attention_Is_All_You_Need.pdf", "notes.md"]
    assert not any(tmp_path.rglob("escape.txt"))

    # Someone who does not control the goal: told privately, nothing lands.
    await fake.user_shares_file(general, card.ts, "bobs.txt", b"hello\n", user=BOB)
    told_bob = (await fake.wait_for(lambda: fake.ephemerals(BOB), 10))[0]
    assert "can give goal #1 files; nothing changed" in told_bob.text
    await eventually(bot.outbox.idle)
    assert not (inputs / "bobs.txt").exists()


async def test_without_files_read_the_note_says_to_reinstall(fake, make_bot, start_runner, tmp_path):
    fake.scopes = fake.scopes.replace("files:read,", "")
    _, _, card = await started_goal(fake, make_bot, start_runner, tmp_path)
    msg = await fake.user_shares_file(fake.general, card.ts, "paper.pdf", PDF, user=ALICE)
    note = await fake.wait_for_message(
        fake.general, thread_ts=card.ts, text="files:read", timeout=20, after=msg.ts
    )
    assert "missing_scope" in note.text and "manifest.yml" in note.text
