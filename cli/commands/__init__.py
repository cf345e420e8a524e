"""The command table, as pip's: each verb's name, the module and class that hold its parser and
`run()`, and the one line `goaltender --help` lists. A verb's module is imported only when that verb
runs (or shows its own --help): every agent verb is a process of its own, and its start-up is
paid on every milestone and metric.

One module per audience: box.py (processes and set-up on the GPU box: runner, bot, service, demo,
doctor, preflight, fetch, backup, restore), operator.py (people driving goals: submit, status, …,
skills), agent.py (the verbs an agent runs from inside its goal: milestone, metrics, experiment, …;
the hottest of them talk through protocol/quick_client.py, on the standard library alone).

A name of two words ("skills edit") is a verb of a group: `goaltender skills edit …`. Old names stay
as aliases (ALIASES), accepted but not listed."""

from __future__ import annotations


class CommandInfo:
    """Where a verb lives (`module` under goaltender.cli.commands, its Command `class_name`) and
    its one-line `summary` (argparse's help: %% for a percent sign)."""

    __slots__ = ("class_name", "module", "summary")

    def __init__(self, module: str, class_name: str, summary: str):
        self.module = module
        self.class_name = class_name
        self.summary = summary


COMMANDS: dict[str, CommandInfo] = {
    # -- the box: its processes, its set-up, its data --
    "runner": CommandInfo("box", "Runner", "start the runner daemon in the foreground"),
    "demo": CommandInfo("box", "Demo", "run a star-count campaign end to end in this terminal"),
    "bot": CommandInfo("box", "Bot", "run the Slack bot: /goal, goal threads, approvals, steering, digests"),
    "doctor": CommandInfo(
        "box",
        "Doctor",
        "check this box is ready for campaigns: GPUs, disk, caches, NeMo RL and Gym, hub, endpoint, SSH",
    ),
    "service": CommandInfo(
        "box", "Service", "write the runner's and the bot's systemd units (docs/deploy.md, Services)"
    ),
    "preflight": CommandInfo(
        "box",
        "Preflight",
        "count tokens per SFT example; refuse (or --drop) those NeMo RL would silently mask",
    ),
    "fetch": CommandInfo(
        "box", "Fetch", "download a model or data set from the hub (or a mirror) into the cache"
    ),
    "backup": CommandInfo(
        "box", "Backup", "copy runner.db and bot.db, consistently, while the runner and the bot run"
    ),
    "restore": CommandInfo(
        "box", "Restore", "put a backup of runner.db or bot.db back (the runner or the bot stopped)"
    ),
    # -- operators: people driving goals --
    "submit": CommandInfo("operator", "Submit", "submit a goal, e.g. 'reach 90%% accuracy, budget 2h'"),
    "status": CommandInfo(
        "operator", "Status", "show goals: state, budgets used, best result (active ones, or --all)"
    ),
    "summary": CommandInfo("operator", "Summary", "print a goal's summary and ledger (markdown)"),
    "steer": CommandInfo("operator", "Steer", "send a steering message to a goal's agent (its inbox)"),
    "budget": CommandInfo(
        "operator", "Budget", "change a goal's budget: '+2h', 'max 10 experiments', 'gpu-hours 8'"
    ),
    "pause": CommandInfo(
        "operator", "Pause", "pause a goal: the running experiment finishes, no new one starts"
    ),
    "resume": CommandInfo("operator", "Resume", "resume a paused goal"),
    "stop": CommandInfo(
        "operator", "Stop", "stop a goal: end its agent and experiments, write the final report"
    ),
    "approve": CommandInfo("operator", "Approve", "approve a pending approval prompt"),
    "reject": CommandInfo("operator", "Reject", "reject a pending approval prompt"),
    "audit": CommandInfo(
        "operator", "Audit", "print the audit trail: control actions and refused attempts, and who"
    ),
    "prune": CommandInfo(
        "operator", "Prune", "remove what goals that ended long ago left: events, run logs, delivered posts"
    ),
    "events": CommandInfo("operator", "Events", "print the event log (optionally follow it)"),
    "disk-usage": CommandInfo(
        "operator",
        "DiskUsage",
        "what each goal's workspace holds on the big disk (checkpoints apart)",
    ),
    "log": CommandInfo("operator", "Log", "print an experiment's log"),
    "skills log": CommandInfo("operator", "SkillsLog", "the skill folder's commits, newest first"),
    "skills revert": CommandInfo("operator", "SkillsRevert", "undo one commit of the skill folder"),
    # -- agents: from inside a goal --
    "milestone": CommandInfo("agent", "Milestone", "report a milestone to the goal's thread"),
    "metrics": CommandInfo("agent", "Metrics", "log metric values"),
    "experiment": CommandInfo("agent", "Experiment", "run one experiment under the runner's supervision"),
    "nemo-rl": CommandInfo(
        "agent", "NemoRL", "train with NeMo RL (sft, grpo, …) as one supervised experiment"
    ),
    "ask": CommandInfo("agent", "Ask", "ask the humans for approval and wait for the answer"),
    "stage-done": CommandInfo(
        "agent", "StageDone", "end the goal's stage: the humans approve before the next one starts"
    ),
    "cross-check": CommandInfo(
        "agent", "CrossCheck", "compare two independent implementations before any campaign"
    ),
    "inbox": CommandInfo(
        "agent", "Inbox", "read steering messages from people (unread ones, then marked read)"
    ),
    "diary": CommandInfo("agent", "Diary", "write or read the goal's diary (durable session memory)"),
    "report": CommandInfo(
        "agent", "Report", "hand in your words for the final report (findings, next steps)"
    ),
    "skills edit": CommandInfo(
        "agent", "SkillsEdit", "propose an edit to one of the box's skills; a person approves the diff"
    ),
}


class GroupInfo:
    """A verb made of verbs (`goaltender skills edit|log|revert`): its summary and --help text."""

    __slots__ = ("description", "summary")

    def __init__(self, summary: str, description: str):
        self.summary = summary
        self.description = description


GROUPS: dict[str, GroupInfo] = {
    "skills": GroupInfo(
        "the box's skill folder: propose an edit (agents), its history, reverting an applied edit",
        """\
        goaltender skills edit --skill NAME --file FILE   (an agent) propose new text for a skill;
                                                          a person approves the diff
        goaltender skills log [--limit N]                 the skill folder's commits, newest first
        goaltender skills revert COMMIT                   undo one commit with a new one (audited)""",
    ),
}

# Old names, kept working for a release and not listed: each is the verb it names.
ALIASES: dict[str, str] = {
    "du": "disk-usage",
    "skill-edit": "skills edit",
}
