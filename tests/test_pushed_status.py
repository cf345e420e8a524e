"""Issue 33: a goal's status is pushed with the events that change its card, not pulled per event.

A subscriber that asks (`statuses`) gets, before each batch of events, the status of every goal
whose card they change (protocol CARD_KINDS), as it stands after them; the bot draws its cards
from that and asks the runner for none while a goal runs. A subscriber that does not ask gets
nothing new, and a runner older than the field is asked again without it.
"""

from __future__ import annotations

from fake_slack import ALICE
from helpers import blocks_text, eventually, submit, write_agent

from goaltender.protocol import messages as p
from goaltender.protocol.client import RunnerClient
from goaltender.storage.records import MilestoneReported

TWO_RUNS = """
goaltender milestone "Plan" "two runs"
goaltender experiment -d one --metric acc -- python -c 'print("acc: 0.4")'
goaltender experiment -d two --metric acc -- python -c 'print("acc: 0.6")'
goaltender report "two runs, the second better"
"""


def counting_status_requests(runner) -> list[p.Status]:
    """Every Status request the runner answers from now on, as it came."""
    asked: list[p.Status] = []
    answer = runner.handlers[p.Status]

    async def counted(req, who):
        asked.append(req)
        return await answer(req, who)

    runner.handlers[p.Status] = counted
    return asked


async def test_a_subscriber_that_asks_gets_each_cards_status_before_its_events(
    start_runner, connect, tmp_path
):
    runner = await start_runner(agents={"wait": write_agent(tmp_path, "wait.sh", "sleep 120\n")})
    client = await connect(runner)
    goal_id = await submit(client, "wait, max 1 experiments", agent="wait")
    await client.request(p.ReportMilestone(goal_id=goal_id, title="not a card change"))

    pushing = await connect(runner, "pushing")
    await pushing.subscribe(since=0, statuses=True)
    plain = await connect(runner, "plain")
    await plain.subscribe(since=0)
    seen = {}
    async for event in pushing.events():
        seen[event.data.kind] = pushing.pushed_status(goal_id, event.seq)
        if event.data.kind == "milestone":
            break
    status = seen["goal_accepted"]
    assert status is not None and status.goal.id == goal_id and status.goal.state == "running"
    async for event in plain.events():
        if event.data.kind == "milestone":
            break
    assert plain.pushed == {}  # not asked: nothing pushed

    # Live: a change of state comes with the status after it.
    await client.request(p.Pause(goal_id=goal_id))
    async for event in pushing.events():
        if event.data.kind == "goal_state":
            assert pushing.pushed_status(goal_id, event.seq).goal.state == "paused"
            break
    await client.request(p.Stop(goal_id=goal_id))


async def test_events_that_change_no_card_bring_no_status(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"wait": write_agent(tmp_path, "wait.sh", "sleep 120\n")})
    client = await connect(runner)
    goal_id = await submit(client, "wait, max 1 experiments", agent="wait")
    head = await client.subscribe(since=0)
    await runner.store.append_event(goal_id, MilestoneReported(title="only a milestone"))
    pushing = await connect(runner, "pushing")
    await pushing.subscribe(since=head, statuses=True)
    async for event in pushing.events():
        assert event.data.kind == "milestone"
        break
    assert pushing.pushed == {}
    await client.request(p.Stop(goal_id=goal_id))


async def test_a_client_asks_again_without_statuses_on_a_runner_that_does_not_know_them(
    start_runner, connect, tmp_path, monkeypatch
):
    runner = await start_runner(agents={"wait": write_agent(tmp_path, "wait.sh", "sleep 120\n")})
    client = await connect(runner)
    goal_id = await submit(client, "wait, max 1 experiments", agent="wait")
    original = p.Subscribe.model_validate

    def older_runner(raw, *args, **kwargs):
        if isinstance(raw, dict) and "statuses" in raw:
            raise p.ValidationError.from_exception_data(
                "Subscribe", [{"type": "extra_forbidden", "loc": ("statuses",), "input": raw["statuses"]}]
            )
        return original(raw, *args, **kwargs)

    monkeypatch.setattr(p.Subscribe, "model_validate", older_runner)
    older = await connect(runner, "older")
    assert await older.subscribe(since=0, statuses=True) >= 1
    async for event in older.events():
        assert event.data.kind == "goal_accepted"
        break
    assert older.pushed == {} and older._statuses is False and older._batches is True
    await client.request(p.Stop(goal_id=goal_id))


async def test_the_bot_draws_a_goals_cards_without_asking_the_runner(fake, make_bot, start_runner, tmp_path):
    runner = await start_runner(
        agents={"two": write_agent(tmp_path, "two.sh", TWO_RUNS)}, default_agent="two"
    )
    asked = counting_status_requests(runner)
    bot = await make_bot(runner.settings.socket_path)
    res = await fake.slash_command("/goal", "find a good acc, max 2 experiments", fake.general, ALICE)
    assert res.acked
    card = await fake.wait_for_message(fake.general, text="Goal #1")
    await fake.wait_for_message(fake.general, thread_ts=card.ts, text="Final report", timeout=60)
    await fake.wait_for(lambda: "finished" in blocks_text(fake.message(fake.general, card.ts)), 30)
    await eventually(bot.outbox.idle)
    card_text = blocks_text(fake.message(fake.general, card.ts))
    assert "2" in card_text and "60.0%" in card_text  # two runs, the best of them
    # The link's health checks may ask for active goals; no request asked for this goal's status.
    assert [req for req in asked if req.goal_id is not None] == []


async def test_an_agents_subscription_pushes_its_own_goals_status_only(start_runner, connect, tmp_path):
    runner = await start_runner(agents={"wait": write_agent(tmp_path, "wait.sh", "sleep 120\n")})
    client = await connect(runner)
    mine = await submit(client, "wait, max 1 experiments", agent="wait")
    other = await submit(client, "wait too, max 1 experiments", agent="wait")
    sock = runner.settings.agent_socket(mine)
    await eventually(sock.exists)
    agent = await RunnerClient.connect_unix(sock, client="agent")
    try:
        await agent.subscribe(since=0, statuses=True)  # every goal, asked: scoped to its own
        async for event in agent.events():
            assert event.goal_id == mine
            if event.data.kind == "goal_state":
                break
        assert set(agent.pushed) == {mine}
    finally:
        await agent.close()
        for goal_id in (mine, other):
            await client.request(p.Stop(goal_id=goal_id))
