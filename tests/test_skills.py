"""The Agent Skills in goaltender/skills: well-formed SKILL.md files whose goaltender commands are real.

Every `goaltender <verb>` a skill mentions must be a subcommand of `goaltender.cli.build_parser()`,
every `--flag` written after it in code must belong to that subcommand, and every command line in a
shell code block must parse. The real command list comes from the parser, so a renamed verb
or flag breaks this test instead of silently breaking an agent. The same holds for the words every
agent is given besides the skills: the brief (agents/briefing.py), the built-in agent's preamble
and Codex's first prompt.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

from goaltender.agents import briefing, codex_prompts, openai_agent
from goaltender.cli import build_parser
from goaltender.storage.records import Goal

SKILLS_DIR = Path(__file__).resolve().parents[1] / "skills"
EXPECTED_SKILLS = {
    "autoresearch",
    "session-memory",
    "gpu-box-etiquette",
    "nemo-gym-environment",
    "nemo-rl",
    "paper-to-code",
}
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
VERB_RE = re.compile(r"\bgoaltender ([a-z][a-z-]*)")
INLINE_CODE_RE = re.compile(r"`([^`\n]+)`")
SHELL_FENCES = {"bash", "sh", "shell", "console", "zsh"}
SHELL_OPERATORS = {";", "&", "&&", "|", "||", "<", "<<", "<<<", ">", ">>", "(", ")", "2>", "&>"}
MAX_SKILL_LINES = 250


def skill_dirs() -> list[Path]:
    return sorted(p for p in SKILLS_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def skill_files() -> list[Path]:
    """SKILL.md and every markdown file under each skill (references/*.md and the like)."""
    return sorted(f for d in skill_dirs() for f in d.rglob("*.md"))


def split_front_matter(text: str) -> tuple[str, str]:
    lines = text.splitlines()
    assert lines and lines[0].strip() == "---", "SKILL.md must start with a '---' line"
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return "\n".join(lines[1:i]), "\n".join(lines[i + 1 :])
    raise AssertionError("front matter is not closed by a second '---' line")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("goaltender's parser has no subcommands")


def option_strings(sub: argparse.ArgumentParser) -> set[str]:
    """Flags of a subcommand, including those of its own sub-actions (diary write / read)."""
    flags = {opt for action in sub._actions for opt in action.option_strings}
    for action in sub._actions:
        if isinstance(action, argparse._SubParsersAction):
            for nested in action.choices.values():
                flags |= option_strings(nested)
    return flags


def code_snippets(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """((fence language, line) for lines in fenced code blocks, backslash continuations joined;
    inline code spans outside the fences)."""
    fenced: list[tuple[str, str]] = []
    inline: list[str] = []
    language: str | None = None  # None: outside a fence
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            language = line.strip()[3:].strip().lower() if language is None else None
            pending = ""
            continue
        if language is not None:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            fenced.append((language, pending + line))
            pending = ""
        else:
            inline.extend(INLINE_CODE_RE.findall(line))
    return fenced, inline


def shell_words(text: str) -> list[str]:
    """Shell-like words of `text`, cut at the first shell operator or comment."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    try:
        for word in lexer:
            if word in SHELL_OPERATORS:
                break
            words.append(word)
    except ValueError:  # unbalanced quotes: keep what was read
        pass
    return words


def goaltender_commands(snippet: str) -> list[list[str]]:
    """Each `goaltender <verb> ...` in a code snippet, as words starting with the verb."""
    return [shell_words(snippet[m.start(1) :]) for m in VERB_RE.finditer(snippet)]


def flags_before_double_dash(words: list[str]) -> list[str]:
    flags = []
    for word in words[1:]:
        if word == "--":
            break
        if word.startswith("-") and len(word) > 1 and not re.match(r"^-\d", word):
            flags.append(word.split("=", 1)[0])
    return flags


def substitute_variables(words: list[str]) -> list[str]:
    """A bare shell variable ($GOALTENDER_GOAL_ID, ${X}) stands for a value; use 1 (valid as an id)."""
    return ["1" if re.fullmatch(r"\$(\w+|\{\w+\})", w) else w for w in words]


# ---------------------------------------------------------------------------------------- structure


def test_the_skills_are_present():
    names = {d.name for d in skill_dirs()}
    assert names >= EXPECTED_SKILLS, f"missing skills: {sorted(EXPECTED_SKILLS - names)}"


@pytest.mark.parametrize("skill", skill_dirs(), ids=lambda p: p.name)
def test_skill_md_front_matter_and_body(skill: Path):
    skill_md = skill / "SKILL.md"
    assert skill_md.is_file(), f"{skill.name} has no SKILL.md"
    front, body = split_front_matter(skill_md.read_text(encoding="utf-8"))
    meta = yaml.safe_load(front)
    assert isinstance(meta, dict), "front matter must be a YAML mapping"
    assert set(meta) == {"name", "description"}, f"front matter keys: {sorted(meta)}"
    assert meta["name"] == skill.name
    assert NAME_RE.match(meta["name"]), f"bad skill name {meta['name']!r}"
    description = meta["description"]
    assert isinstance(description, str) and description.strip(), "description must be non-empty text"
    assert len(description) < 1024, f"description is {len(description)} chars"
    assert body.strip(), "SKILL.md has no body after the front matter"


@pytest.mark.parametrize("skill", skill_dirs(), ids=lambda p: p.name)
def test_skill_md_stays_focused_and_its_references_exist(skill: Path):
    text = (skill / "SKILL.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_SKILL_LINES, "move long material to references/*.md"
    for ref in re.findall(r"references/[\w.-]+\.md", text):
        assert (skill / ref).is_file(), f"{skill.name}/SKILL.md points to missing {ref}"


# ----------------------------------------------------------------------------- commands are real


def test_subcommands_come_from_the_parser():
    subs = subcommands()
    assert {"experiment", "ask", "diary", "inbox", "milestone", "report"} <= set(subs)


@pytest.mark.parametrize("path", skill_files(), ids=lambda p: str(p.relative_to(SKILLS_DIR)))
def test_every_goaltender_verb_exists(path: Path):
    subs = subcommands()
    text = path.read_text(encoding="utf-8")
    unknown = sorted({m.group(1) for m in VERB_RE.finditer(text)} - set(subs))
    assert not unknown, f"not goaltender subcommands: {unknown} (real: {sorted(subs)})"


@pytest.mark.parametrize("path", skill_files(), ids=lambda p: str(p.relative_to(SKILLS_DIR)))
def test_flags_after_a_goaltender_command_exist(path: Path):
    subs = subcommands()
    fenced, inline = code_snippets(path.read_text(encoding="utf-8"))
    problems = []
    for snippet in [line for _, line in fenced] + inline:
        for words in goaltender_commands(snippet):
            if not words or words[0] not in subs:
                continue  # reported by test_every_goaltender_verb_exists
            known = option_strings(subs[words[0]])
            problems += [
                f"{flag} in: {snippet.strip()}"
                for flag in flags_before_double_dash(words)
                if flag not in known
            ]
    assert not problems, "unknown flags:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", skill_files(), ids=lambda p: str(p.relative_to(SKILLS_DIR)))
def test_fenced_goaltender_commands_parse(path: Path):
    subs = subcommands()
    fenced, _ = code_snippets(path.read_text(encoding="utf-8"))
    problems = []
    for language, line in fenced:
        # Whole commands only: a line of a shell block that starts with `goaltender <verb>`.
        if language not in SHELL_FENCES or not re.match(r"\s*goaltender [a-z]", line):
            continue
        words = goaltender_commands(line)[0]
        if words[0] not in subs:
            continue  # reported by test_every_goaltender_verb_exists
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(substitute_variables(words))
        except SystemExit as exc:
            if exc.code:
                problems.append(f"{line.strip()}\n    {err.getvalue().strip().splitlines()[-1]}")
    assert not problems, "commands that goaltender would reject:\n" + "\n".join(problems)


def test_the_briefs_commands_are_real():
    subs = subcommands()
    text = "\n".join(
        [
            *briefing.training_lines("verbs"),
            *briefing.metric_lines(None, "maximize"),
            *briefing.how_to_work("verbs"),
            *briefing.environment_lines(Goal(id=1, text="improve star count"), "verbs"),
            openai_agent.PREAMBLE,
            codex_prompts.first_prompt(),
        ]
    )
    assert {"doctor", "fetch", "preflight", "nemo-rl"} <= {m.group(1) for m in VERB_RE.finditer(text)}
    unknown = sorted({m.group(1) for m in VERB_RE.finditer(text)} - set(subs))
    assert not unknown, f"not goaltender subcommands: {unknown}"
    _, inline = code_snippets(text)
    for snippet in inline:
        for words in goaltender_commands(snippet):
            known = option_strings(subs[words[0]])
            assert all(flag in known for flag in flags_before_double_dash(words)), snippet
    assert "nemo-rl" in set(briefing.list_skills())  # the skill the brief points to ships


def test_the_checks_catch_mistakes():
    """The helpers above really find a wrong verb and a wrong flag, and argparse rejects bad commands."""
    subs = subcommands()
    fake = 'goaltender experimnt -d x\n```bash\ngoaltender ask "go?" --cost \\\n  --kind cost\n```\n'
    assert {m.group(1) for m in VERB_RE.finditer(fake)} - set(subs) == {"experimnt"}
    fenced, _ = code_snippets(fake)
    assert fenced[0][0] == "bash"
    (words,) = goaltender_commands(fenced[0][1])
    assert words == ["ask", "go?", "--cost", "--kind", "cost"]
    assert [f for f in flags_before_double_dash(words) if f not in option_strings(subs["ask"])] == ["--cost"]
    words = goaltender_commands("goaltender experiment -d h --metric m -- python t.py --lr 3 | tee x")[0]
    assert flags_before_double_dash(words) == ["-d", "--metric"]
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        build_parser().parse_args(["ask", "go?", "--urgent"])
    build_parser().parse_args(substitute_variables(["summary", "$GOALTENDER_GOAL_ID"]))
