"""Each request carries its contract (protocol/messages.py): its reply, who may send it, how it is
audited; the runner's trust and audit tables are derived from it, and equal the hand-kept tables
they replaced."""

import pytest

from goaltender.protocol import messages as p
from goaltender.runner import audit, trust

# The tables as runner/trust.py and runner/audit.py kept them by hand before they were derived.
AGENT_VERBS = {
    p.ReportMilestone, p.LogMetrics, p.RunExperiment, p.Ask, p.StageDone, p.CrossCheck,
    p.ReadInbox, p.WriteDiary, p.ReadDiary, p.SubmitReport, p.Fetch, p.SkillEdit,
}  # fmt: skip
GOAL_READS = {p.Status, p.Summary, p.GetSeries, p.Subscribe, p.GetLog, p.GetArtifact, p.DiskUsage}
CONNECTION_REQUESTS = {p.Hello, p.Ack}
PEOPLE_ONLY = {
    p.SubmitGoal: "submit goals: people do, with /goal in Slack or `goaltender submit` as an operator",
    p.Decide: "decide approvals: a person does, in the goal's thread or with `goaltender approve` "
    "as an operator",
    p.Steer: "steer goals: people do, by replying in the goal's thread or with `goaltender steer` "
    "as an operator",
    p.ChangeBudget: "change budgets: people do, in the goal's thread (`budget +2h`) or with "
    "`goaltender budget` as an operator",
    p.Stop: "stop goals: people do, in the goal's thread or with `goaltender stop` as an operator",
    p.Pause: "pause goals: people do, in the goal's thread or with `goaltender pause` as an operator",
    p.Resume: "resume goals: people do, in the goal's thread or with `goaltender resume` as an operator",
    p.Audit: "read the audit trail: operators do, with `goaltender audit`",
    p.Prune: "prune the runner's history: operators do, with `goaltender prune`",
    p.SkillLog: "read the skill folder's history: operators do, with `goaltender skills log`",
    p.RevertSkill: "revert skill edits: operators do, with `goaltender skills revert COMMIT`",
    p.PutInput: "give goals files: people do, by attaching them in the goal's thread",
}
CONTROL_ACTIONS = {
    p.SubmitGoal: "submit", p.Steer: "steer", p.ChangeBudget: "budget", p.Stop: "stop",
    p.Pause: "pause", p.Resume: "resume", p.RevertSkill: "skill revert", p.Prune: "prune",
    p.PutInput: "input file",
}  # fmt: skip


def test_the_derived_trust_tables_are_the_hand_kept_ones():
    assert trust.AGENT_VERBS == AGENT_VERBS
    assert trust.GOAL_READS == GOAL_READS
    assert trust.CONNECTION_REQUESTS == CONNECTION_REQUESTS
    assert trust.PEOPLE_ONLY == PEOPLE_ONLY
    every = AGENT_VERBS | GOAL_READS | CONNECTION_REQUESTS | set(PEOPLE_ONLY)
    assert every == set(p.REQUEST_MODELS.values())  # each request in exactly one sender class
    assert len(every) == len(AGENT_VERBS) + len(GOAL_READS) + len(CONNECTION_REQUESTS) + len(PEOPLE_ONLY)


def test_the_derived_audit_actions_are_the_hand_kept_ones():
    assert {m: a for m, a in audit.CONTROL_ACTIONS.items() if m is not p.Decide} == CONTROL_ACTIONS
    for model in p.REQUEST_MODELS.values():
        assert audit.is_control(model.model_construct()) == (model in CONTROL_ACTIONS or model is p.Decide)
    assert audit.action_of(p.Decide(approval_id=1, approve=True)) == "approve"
    assert audit.action_of(p.Decide(approval_id=1, approve=False)) == "reject"
    assert audit.action_of(p.Status()) == "status"  # a read refused for who asked: its type


def test_each_request_names_the_reply_its_handler_gives():
    assert p.SubmitGoal.reply_type is p.GoalReply
    assert p.Stop.reply_type is p.Done
    assert p.Ask.reply_type is p.DecisionReply
    assert all(issubclass(m.reply_type, p.Reply) for m in p.REQUEST_MODELS.values())


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "name its reply model"),
        ({"__annotations__": {}}, "name its reply model"),
    ],
)
def test_a_request_without_a_reply_cannot_be_defined(body, says):
    with pytest.raises(TypeError, match=says):
        type("Launch", (p.Request,), {"__module__": __name__, **body})


def test_a_request_without_a_sender_cannot_be_defined():
    with pytest.raises(TypeError, match="say who may send it"):

        class Launch(p.Request[p.Done]):
            type: str = "launch"

    with pytest.raises(TypeError, match="people_do"):

        class Launch2(p.Request[p.Done]):
            sender = "operator"  # and nothing said to an agent that asks
            type: str = "launch"


def test_a_request_built_to_send_is_refused_as_the_runner_would():
    with pytest.raises(p.ProtocolError, match="invalid steer: text: is blank"):
        p.Steer(goal_id=1, text="  ")
