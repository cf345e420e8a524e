"""Secrets stay on the box: the Redactor (properties and token shapes), the environment agents get,
state file modes, and a whole goal whose agent and experiment leak every secret they can."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import stat
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from helpers import approval_prompts, events_until_report, eventually, submit, write_agent
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from goaltender.protocol import messages as p
from goaltender.runner.campaign import _tail_text
from goaltender.runner.config import RunnerSettings
from goaltender.runner.secrets import (
    Redactor,
    agent_safe,
    configured_secrets,
    png_picture_only,
    secret_looking,
)
from goaltender.storage.bot_store import BotStore
from goaltender.storage.records import Event, MilestoneReported, utcnow

# ---- the Redactor: properties ----

# Secrets: 8+ characters of anything but '[' and ']' (the replacement markers' brackets) and lone
# surrogates (no JSON encoder takes them).
secret_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="[]"), min_size=8, max_size=40
)
any_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
# Text that cannot hold a token shape: no '-' or '_' (every shape has one but AWS key ids).
plain_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="-_"), max_size=200)


def milestone_line(title: str, text: str = "") -> bytes:
    event = Event(seq=7, goal_id=1, ts=utcnow(), data=MilestoneReported(title=title, text=text))
    return p.encode(p.EventMessage(id=3, event=event))


def escaped_forms(secret: str) -> set[str]:
    return {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}


@settings(deadline=None)
@given(secret=secret_text, before=any_text, after=any_text)
def test_a_secret_never_survives_redaction(secret, before, after):
    redactor = Redactor([("MY_SECRET", secret)])
    text = before + secret + after
    assert secret not in redactor.redact(text)
    assert secret not in redactor.redact_edges(text)


@settings(deadline=None)
@given(secret=secret_text, before=st.binary(max_size=40), after=st.binary(max_size=40))
@example(secret="\U00010000" + "0" * 7, before=b"\\", after=b"")  # its escape after a stray backslash
def test_a_secret_never_survives_in_a_file(secret, before, after):
    """redact_file: bytes of any kind around a secret, raw or JSON-escaped; what has none is untouched."""
    redactor = Redactor([("MY_SECRET", secret)])
    for form in escaped_forms(secret):
        out = redactor.redact_file(before + form.encode(errors="surrogatepass") + after)
        assert form.encode(errors="surrogatepass") not in out
    plain = bytes(c for c in before + after if not chr(c).isascii() or not chr(c).isalpha())  # no shape
    assume(all(form.encode(errors="surrogatepass") not in plain for form in escaped_forms(secret)))
    assert redactor.redact_file(plain) is plain


@settings(deadline=None)
@given(secret=secret_text, before=any_text, after=any_text, other=any_text)
def test_a_secret_never_survives_in_an_encoded_line(secret, before, after, other):
    redactor = Redactor([("MY_SECRET", secret)])
    out = redactor.redact_line(milestone_line(before + secret + after, other + secret))
    assert out.endswith(b"\n") and out.count(b"\n") == 1
    text = out.decode()
    assert not any(form in text for form in escaped_forms(secret))
    reply = p.parse_reply(out)  # still one valid message of the same type
    assert isinstance(reply, p.EventMessage) and reply.id == 3 and reply.event.seq == 7
    assert isinstance(reply.event.data, MilestoneReported)
    assert secret not in reply.event.data.title and secret not in reply.event.data.text


@settings(deadline=None)
@given(secret=secret_text, text=plain_text, other=plain_text)
def test_text_without_secrets_passes_through_byte_identical(secret, text, other):
    assume(secret not in text and secret not in other and not re.search("AKIA|ASIA", text + other))
    redactor = Redactor([("MY_SECRET", secret)])
    assert redactor.redact(text) is text
    line = milestone_line(text, other)
    assert redactor.redact_line(line) is line


# ---- the Redactor: text as its reader decodes it ----

_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


@st.composite
def json_string(draw, text: str) -> str:
    r"""`text` as the inside of a JSON string, each character escaped or not at random: as it is
    (where JSON allows), as \uXXXX (either case; a surrogate pair beyond the BMP), or its one-letter
    escape (\/ for '/')."""
    out = []
    for char in text:
        ways = ["u"]
        if char not in '"\\' and ord(char) >= 0x20:
            ways.append("as is")
        if char in _SHORT_ESCAPES:
            ways.append("short")
        way = draw(st.sampled_from(ways))
        if way == "as is":
            out.append(char)
        elif way == "short":
            out.append(_SHORT_ESCAPES[char])
        else:
            escaped = json.dumps(char)[1:-1] if ord(char) > 0xFFFF else f"\\u{ord(char):04x}"
            out.append(escaped.upper().replace("\\U", "\\u") if draw(st.booleans()) else escaped)
    return "".join(out)


def decoded_strings(data: bytes) -> str:
    """Every string of a JSON document (keys too), as the bot's json.loads gives them."""
    parts: list[str] = []

    def walk(value):
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for key, item in value.items():
                parts.append(key)
                walk(item)

    walk(json.loads(data))
    return "\n".join(parts)


@settings(max_examples=500, deadline=None)
@given(secret=secret_text, before=any_text, after=any_text, data=st.data())
def test_no_json_encoding_of_a_secret_survives_in_a_file(secret, before, after, data):
    r"""An errors.json with the secret written with `\/` or one `\u`-escaped letter passed (only
    the raw and the usual escaped forms were looked for), and the bot decoded it and posted the
    secret. Whatever characters are escaped, the document decodes to no secret after redact_file,
    in a value or a key; and redact on the file's text does the same."""
    redactor = Redactor([("MY_SECRET", secret)])
    text = data.draw(json_string(before + secret + after))
    key = data.draw(json_string(secret))
    document = f'{{"text": "{text}", "{key}": [1, "{text}"]}}'.encode(errors="surrogatepass")
    assert secret in decoded_strings(document)
    redacted = redactor.redact_file(document)
    assert secret not in decoded_strings(redacted)
    assert "[redacted:MY_SECRET]" in decoded_strings(redacted)
    as_text = redactor.redact(document.decode(errors="surrogatepass"))
    assert secret not in decoded_strings(as_text.encode(errors="surrogatepass"))


@settings(max_examples=500, deadline=None)
@given(secret=secret_text, text=plain_text, binary=st.binary(max_size=40), data=st.data())
def test_a_file_without_a_secret_comes_back_byte_for_byte(secret, text, binary, data):
    """However its text is escaped, and whatever bytes are around it (not UTF-8 too)."""
    assume(secret not in text and not re.search("AKIA|ASIA", text) and "://" not in text)
    assume(secret not in urllib.parse.unquote(text))  # %XX spelling the secret is the secret
    redactor = Redactor([("MY_SECRET", secret)])
    document = f'{{"text": "{data.draw(json_string(text))}"}}'.encode(errors="surrogatepass")
    assert redactor.redact_file(document) is document
    assert redactor.redact_file(binary + document + binary) == binary + document + binary


PNG_CHUNKS = [b"IHDR", b"IDAT", b"IEND", b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"prVt"]


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(st.tuples(st.sampled_from(PNG_CHUNKS), st.binary(max_size=20)), max_size=8),
    tail=st.binary(max_size=20),
    cut=st.integers(0, 400),
)
def test_a_png_keeps_only_its_picture(chunks, tail, cut):
    """Whatever chunks (and bytes after them, or a file cut short) a PNG has: a well-formed one
    comes back with its picture's chunks only, in order, ending at IEND; anything else as it was."""
    body = b"".join(len(data).to_bytes(4, "big") + kind + data + b"\0\0\0\0" for kind, data in chunks)
    png = (b"\x89PNG\r\n\x1a\n" + body + tail)[: 8 + cut]
    out = png_picture_only(png)
    if out is png:
        return
    assert out.startswith(b"\x89PNG\r\n\x1a\n") and len(out) < len(png)
    kept, at = [], 8
    while at < len(out):
        size = int.from_bytes(out[at : at + 4], "big")
        kept.append(out[at + 4 : at + 8])
        at += 12 + size
    assert at == len(out) and kept[-1] == b"IEND"
    assert set(kept) <= {b"IHDR", b"IDAT", b"IEND"}


@settings(max_examples=300, deadline=None)
@given(secret=secret_text, before=any_text, after=any_text, data=st.data())
def test_a_secret_json_escaped_inside_a_message_is_redacted(secret, before, after, data):
    """A milestone whose text is JSON that holds the secret escaped (an agent pasted a file): the
    line holds it escaped twice, which the line's needles did not see."""
    redactor = Redactor([("MY_SECRET", secret)])
    line = milestone_line("a file", '{"k": "' + data.draw(json_string(before + secret + after)) + '"}')
    reply = p.parse_reply(redactor.redact_line(line))
    pasted = reply.event.data.text.encode(errors="surrogatepass")
    assert secret not in decoded_strings(pasted)


def test_a_secret_is_found_percent_encoded_and_split_into_escapes():
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    redactor = Redactor([("AWS_SECRET_ACCESS_KEY", secret)])
    marker = "[redacted:AWS_SECRET_ACCESS_KEY]"
    assert redactor.redact(f"GET /?k={urllib.parse.quote(secret, safe='')} 200") == f"GET /?k={marker} 200"
    assert redactor.redact(secret.replace("/", "\\/")) == marker
    assert redactor.redact("wJalrXUtnF\\u0045MI%2FK7MDENG\\/bPxRfiCYEXAMPLEKEY!") == marker + "!"
    emoji = Redactor([("E", "key-😀-12345")])
    assert emoji.redact('{"k": "key-\\ud83d\\ude00-12345"}') == '{"k": "[redacted:E]"}'
    ordinary = 'C:\\new\\table 100%|###| %zz \\u00e9t\\u00e9 "a\\/b"'
    assert redactor.redact(ordinary) is ordinary and emoji.redact_file(ordinary.encode()) == ordinary.encode()


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "GET http://user:s3cretpass@127.0.0.1:43121/org/tiny",
            "GET http://[redacted]@127.0.0.1:43121/org/tiny",
        ),
        ("https://x-access-token:ghs_abc@github.com/o/r.git", "https://[redacted]@github.com/o/r.git"),
        (
            "HF_ENDPOINT=https://ana:p@ss:w0rd@mirror.internal",
            "HF_ENDPOINT=https://[redacted]@mirror.internal",
        ),
        ("proxy http://ana:p%40ss@proxy:3128, then", "proxy http://[redacted]@proxy:3128, then"),
        ("'http://token@host' and 'a@b'", "'http://[redacted]@host' and 'a@b'"),
        # (found decoded: the escapes it was found through go with it)
        ('{"url":"https:\\/\\/u:hunter22@h.io\\/x"}', '{"url":"https://[redacted]@h.io\\/x"}'),
        ("mail ana@corp.com about https://corp.com/a@b", "mail ana@corp.com about https://corp.com/a@b"),
        ("https://mirror.internal/x and ana@corp.com", "https://mirror.internal/x and ana@corp.com"),
    ],
)
def test_urls_lose_their_credentials(text, shown):
    redactor = Redactor()
    assert redactor.redact(text) == shown
    assert redactor.redact_file(text.encode()) == shown.encode()
    line = milestone_line(text)
    assert p.parse_reply(redactor.redact_line(line)).event.data.title == shown


def test_the_password_of_a_url_in_the_environment_is_a_secret_anywhere():
    env = {"HF_ENDPOINT": "https://ana:Pl%40nted-pass@mirror.internal", "HOME": "/root", "NO_PROXY": "a@b"}
    redactor = Redactor.from_environment(env)
    assert redactor.redact("auth=('ana', 'Pl@nted-pass')") == "auth=('ana', '[redacted:HF_ENDPOINT]')"
    assert redactor.redact("raw Pl%40nted-pass") == "raw [redacted:HF_ENDPOINT]"


# ---- the Redactor: token shapes and edges ----

PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACDx0Xq8mQy5cJm2hG7\n"
    "-----END OPENSSH PRIVATE KEY-----"
)
SHAPES = [
    "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp",
    "xoxp-1234567890-0987654321-1234567890-abcdef",
    "xapp-1-A0123456789-1234567890123-abcdef0123456789",
    "sk-" + "A1b2C3d4" * 6,
    "sk-proj-" + "Ab1_Cd2-" * 20,
    "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
    "ghp_" + "a1B2c3D4e5" * 4,
    "ghs_" + "a1B2c3D4e5" * 4,
    "github_pat_11ABCDEFG0" + "abcdefghij_" * 7,
    "AKIAIOSFODNN7EXAMPLE",
    "ASIAY34FZKBOKMUTVV7A",
    PEM,
]


@pytest.mark.parametrize("token", SHAPES)
def test_token_shapes_are_redacted_in_text_and_lines(token):
    redactor = Redactor()
    for text in (f"key={token} end", f"\x1b[31m{token}\x1b[0m", f'"{token}"\n', token):
        out = redactor.redact(text)
        assert token not in out and "[redacted]" in out
    line = milestone_line(f"leaked: {token}", f"again\n{token}\n")
    out = redactor.redact_line(line)
    assert not any(form in out.decode() for form in escaped_forms(token))
    assert p.parse_reply(out).event.data.title == "leaked: [redacted]"


def test_private_keys_cut_short_are_redacted():
    body = PEM.splitlines()
    redactor = Redactor()
    no_end = redactor.redact("log:\n" + "\n".join(body[:3]))  # the log stopped mid-key
    assert body[1] not in no_end and body[2] not in no_end
    no_begin = redactor.redact("\n".join(body[1:]) + "\nthe rest")  # a tail that starts mid-key
    assert no_begin == "[redacted]\nthe rest"
    cut_line = redactor.redact(body[1][30:] + "\n" + "\n".join(body[2:]))
    assert body[1][30:] not in cut_line


@pytest.mark.parametrize(
    "text",
    [
        "task-run-with-large-batch-size-and-warmup",  # 'sk-' inside a word
        "pip install scikit-learn; sk-learn is not a token",
        "hf_hub_download(repo_id=...)",
        "AKIA is a prefix; ASIA-PACIFIC",
        "the SSH key is in ~/.ssh (PRIVATE KEY, not shown)",
    ],
)
def test_ordinary_text_is_left_alone(text):
    assert Redactor().redact(text) is text


def test_markers_name_the_secret_and_never_contain_one():
    assert (
        Redactor([("HF_TOKEN", "hf-planted-1234")]).redact("a hf-planted-1234 b") == "a [redacted:HF_TOKEN] b"
    )
    odd = Redactor([("ODD", "redacted"), ("X", "[redacted]")])  # secrets no marker with 'redacted' may hold
    assert odd.redact("the word redacted, sk-" + "a1" * 12) == "the word [secret], [secret]"


def test_log_chunks_cut_inside_a_secret_lose_both_pieces():
    secret = "planted-Secret-Value-0123456789"
    redactor = Redactor([("MY_TOKEN", secret)])
    log = f"step 1\nexport MY_TOKEN={secret}\nstep 2\n"
    cut = log.index(secret) + 12
    first, second = redactor.redact_edges(log[:cut]), redactor.redact_edges(log[cut:])
    assert secret[:12] not in first and secret[12:] not in second
    assert first.endswith("[redacted:MY_TOKEN]") and second.startswith("[redacted:MY_TOKEN]")
    assert redactor.redact_edges("step 1\nstep 2\n") == "step 1\nstep 2\n"


def test_a_line_that_is_not_json_is_redacted_anyway():
    redactor = Redactor([("K", "planted-secret-1")])
    assert redactor.redact_line(b'{"broken": "planted-secret-1\n') == b'{"broken": "[redacted:K]\n'
    token = "sk-proj-" + "Ab1_Cd2-" * 20
    not_utf8 = b'{"x": "' + token.encode() + b'", \xff\n'
    assert redactor.redact_line(not_utf8) == '{"x": "[redacted]", \ufffd\n'.encode()


# ---- which variables are secrets, and what agents keep ----


def test_secret_looking_variables():
    assert secret_looking("HF_TOKEN", "hf_abcdefgh12345")
    assert secret_looking("pgpassword", "hunter2hunter2")
    assert secret_looking("GOOGLE_APPLICATION_CREDENTIALS_JSON", '{"type": "service_account"}')
    assert not secret_looking("HF_TOKEN", "short")  # too short to redact safely
    assert not secret_looking("GOALTENDER_CONTEXT_TOKENS", "128000")  # a number, not a secret
    assert not secret_looking("SSH_KEY_PATH", str(Path(__file__)))  # names where a key is
    assert not secret_looking("GOALTENDER_SECRETS", "HF_TOKEN,MY_DB_URL")  # our own setting
    assert not secret_looking("OPENAI_BASE_URL", "http://gpu-box:8000/v1")


def test_agents_keep_only_granted_secrets(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/ml",
        "OPENAI_API_KEY": "sk-planted-openai-key",
        "HF_TOKEN": "hf_planted_token_1234",
        "SLACK_BOT_TOKEN": "xoxb-planted-slack",
        "SLACK_APP_TOKEN": "xapp-1",  # short, but a Slack variable
        "SLACK_SIGNING_SECRET": "0123abcd0123abcd",
        "WANDB_API_KEY": "planted-wandb-key",
        "AWS_SECRET_ACCESS_KEY": "/wJalrXUtnFEMI/K7MDENG",  # looks like a path, is not one
        "MY_DB_URL": "postgres://ml:planted@db/runs",
        "GOALTENDER_CONTEXT_TOKENS": "32000",
        "GOALTENDER_MODEL": "Qwen/Qwen3-32B",
    }
    runner = RunnerSettings(home=tmp_path, secrets=["MY_DB_URL"])
    assert sorted(agent_safe(env, runner)) == [
        "GOALTENDER_CONTEXT_TOKENS",
        "GOALTENDER_MODEL",
        "HF_TOKEN",
        "HOME",
        "OPENAI_API_KEY",
        "PATH",
    ]
    explicit = RunnerSettings(home=tmp_path, grants=["WANDB_API_KEY"])
    kept = agent_safe(env, explicit)
    assert "WANDB_API_KEY" in kept and "OPENAI_API_KEY" not in kept and "HF_TOKEN" not in kept
    assert "MY_DB_URL" in kept  # not configured as a secret there, and its name says nothing
    assert not any(name.startswith("SLACK_") for name in agent_safe(env, RunnerSettings(home=tmp_path)))


def test_secret_and_grant_settings(tmp_path, monkeypatch):
    key_file = tmp_path / "deploy.key"
    key_file.write_text("-----BEGIN KEY-----\nline-one-of-the-key\nline-two-of-the-key\n-----END KEY-----\n")
    monkeypatch.setenv("GOALTENDER_SECRETS", f"MY_DB_URL, {key_file}, {tmp_path / 'missing'}")
    monkeypatch.setenv("GOALTENDER_GRANTS", '["HF_TOKEN"]')
    runner = RunnerSettings(home=tmp_path)
    assert runner.secrets == ["MY_DB_URL", str(key_file), str(tmp_path / "missing")]
    assert runner.grants == ["HF_TOKEN"]
    found = configured_secrets(
        runner, {"MY_DB_URL": "postgres://ml:planted@db/runs", "X_TOKEN": "tok-12345678"}
    )
    assert ("MY_DB_URL", "postgres://ml:planted@db/runs") in found
    assert ("deploy.key", "line-one-of-the-key") in found and ("X_TOKEN", "tok-12345678") in found
    monkeypatch.setenv("GOALTENDER_GRANTS", "")
    assert RunnerSettings(home=tmp_path).grants == []
    monkeypatch.delenv("GOALTENDER_GRANTS")
    assert "SLACK_BOT_TOKEN" not in RunnerSettings(home=tmp_path).grants


# ---- state file modes ----


@pytest.fixture
def open_umask():
    old = os.umask(0)  # modes must not depend on the umask
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_runner_state_is_private(start_runner, tmp_path, open_umask):
    (tmp_path / "home").mkdir(mode=0o755)  # an existing home from an older version is tightened
    (tmp_path / "home" / "runner.db").touch(mode=0o644)
    runner = await start_runner()
    settings = runner.settings
    for directory in (settings.home, settings.workspaces, settings.cache_dir):
        assert mode(directory) == 0o700, directory
    for state in ("runner.db", "runner.db-wal", "runner.db-shm"):
        assert mode(settings.home / state) == 0o600, state
    assert mode(settings.socket_path) == 0o600


async def test_bot_database_is_private(tmp_path, open_umask):
    store = await BotStore.open(tmp_path / "bot-home" / "state" / "bot.db")
    try:
        assert mode(tmp_path / "bot-home") == 0o700 and mode(tmp_path / "bot-home" / "state") == 0o700
        for state in ("bot.db", "bot.db-wal", "bot.db-shm"):
            assert mode(tmp_path / "bot-home" / "state" / state) == 0o600, state
    finally:
        await store.close()


# ---- a whole goal: every secret planted, printed and leaked, none reaching a client ----

LEAKY_AGENT = """
env > env.txt
mapfile -t SECRETS <<'END_OF_SECRETS'
{secrets}
END_OF_SECRETS
printf '%s\\n' "${{SECRETS[@]}}" > leak.txt
ALL="${{SECRETS[*]}}"
goaltender milestone "Plan: $ALL" "details: $ALL"
goaltender experiment -d "hypothesis $ALL" --param "token=$ALL" --metric acc -- \\
    bash -c 'env > exp_env.txt; echo "run sees: $1"; cat leak.txt; echo "acc: 0.5"' run "$ALL"
goaltender ask "May I publish $ALL?" --detail "$ALL" --kind generic
goaltender report "Final words: $ALL"
echo "about to crash; my secrets: $ALL"
cat leak.txt
exit 3
"""


async def read_everything(socket_path: Path, goal_id: int, experiment_ids: list[int]) -> bytes:
    """Every byte a client gets: the event log from 0, Status, Summary and each experiment's log."""
    reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=p.MAX_LINE)
    requests = [
        p.Hello(id=1, version=p.PROTOCOL_VERSION, client="tap"),
        p.Subscribe(id=2, since=0),
        p.Status(id=3),
        p.Status(id=4, goal_id=goal_id),
        p.Summary(id=5, goal_id=goal_id),
        *(p.GetLog(id=6 + i, experiment_id=e) for i, e in enumerate(experiment_ids)),
    ]
    for request in requests:
        writer.write(request.model_dump_json().encode() + b"\n")
    await writer.drain()
    received, answered, reported = b"", set(), False
    while not (reported and answered == {r.id for r in requests}):
        line = await asyncio.wait_for(reader.readline(), 30)
        assert line, "the runner hung up"
        received += line
        reply = p.parse_reply(line)
        if isinstance(reply, p.EventMessage):
            reported = reported or reply.event.data.kind == "report"
        else:
            answered.add(reply.id)
    writer.close()
    return received


async def test_planted_secrets_never_reach_a_client(start_runner, connect, tmp_path, monkeypatch):
    planted = {
        "OPENAI_API_KEY": "sk-proj-PlantedOpenAI" + "3f9a" * 6,
        "SLACK_BOT_TOKEN": "xoxb-1111-2222-PlantedSlackBotToken",
        "HF_TOKEN": "hf_PlantedHuggingFace0123456789ab",
        "WANDB_API_KEY": 'wandb"planted\\key-0123',  # JSON escapes on the way out
        "MY_DB_URL": "postgres://ml:planted-db-password@db.internal/runs",  # configured by name
    }
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    secret_file = tmp_path / "vault" / "service.token"
    secret_file.parent.mkdir()
    secret_file.write_text("planted-file-secret-5c1e8d\n")
    secrets = [*planted.values(), "planted-file-secret-5c1e8d"]
    # The agent "found" every secret (they are in its script) and prints them wherever it can.
    agent = write_agent(tmp_path, "leaky.sh", LEAKY_AGENT.format(secrets="\n".join(secrets)))
    runner = await start_runner(agents={"leaky": agent}, secrets=["MY_DB_URL", str(secret_file)])
    client = await connect(runner)
    goal_id = await submit(
        client, f"tune lr, the db is {planted['MY_DB_URL']}, max 2 experiments", owner="ana", agent="leaky"
    )

    async def approve():
        watcher = await connect(runner, "watcher")
        async for approval in approval_prompts(watcher, goal_id):
            await watcher.request(p.Decide(approval_id=approval.id, approve=True, by="ana"))
            return

    approving = asyncio.ensure_future(approve())
    events = await events_until_report(client, goal_id)
    await approving
    summary = await client.request(p.Summary(goal_id=goal_id))
    received = await read_everything(runner.settings.socket_path, goal_id, [e.id for e in summary.ledger])

    text = received.decode()
    for secret in secrets:
        for form in escaped_forms(secret):
            assert text.count(form) == 0, f"{secret!r} reached a client"
    # ... and each place it was printed still arrived, redacted.
    report = events[-1].data
    assert "Final words: [redacted:OPENAI_API_KEY]" in report.text
    assert "the agent exited with code 3" in report.end_reason and "about to crash" in report.end_reason
    assert "[redacted:service.token]" in report.end_reason and "[redacted:WANDB_API_KEY]" in report.end_reason
    assert summary.status.goal.text.startswith("tune lr, the db is [redacted:MY_DB_URL]")
    assert summary.ledger[0].params["token"].startswith("[redacted:OPENAI_API_KEY]")
    milestone = next(e.data for e in events if e.data.kind == "milestone")
    assert "[redacted:SLACK_BOT_TOKEN]" in milestone.title and "[redacted:HF_TOKEN]" in milestone.text
    assert "run sees: [redacted" in text and "May I publish [redacted" in text

    workspace = Path(summary.status.goal.workspace)
    on_disk = (workspace / "agent.log").read_text() + (workspace / "experiments/001/run.log").read_text()
    assert all(secret in on_disk for secret in secrets)  # they were printed; the runner kept them in
    for private in ("agent.log", "experiments/001/run.log"):  # ... and only the runner's user reads them
        assert mode(workspace / private) == 0o600, private
    assert mode(workspace / "experiments") == 0o700 and mode(workspace / "experiments/001") == 0o700
    for env_file in ("env.txt", "exp_env.txt"):
        names = {line.split("=", 1)[0] for line in (workspace / env_file).read_text().splitlines()}
        assert {"OPENAI_API_KEY", "HF_TOKEN"} <= names, env_file  # granted by default
        assert not names & {"SLACK_BOT_TOKEN", "WANDB_API_KEY", "MY_DB_URL"}, env_file


def test_a_crashed_agents_log_tail_starts_at_a_line(tmp_path):
    """The tail quoted when an agent fails never begins mid-line, where a cut secret would be too
    short to recognise."""
    secret = "hf_" + "A1b2C3d4" * 4
    lines = [f"line {i}: token {secret}" for i in range(200)]
    (tmp_path / "agent.log").write_text("\n".join(lines) + "\nbye\n")
    tail = _tail_text(tmp_path, 1500)
    assert tail.startswith("line ") and tail.endswith("bye") and len(tail) <= 1500
    assert all(secret in line for line in tail.splitlines()[:-1])


class Everywhere:
    """Needles that are in every haystack."""

    def in_(self, haystack) -> bool:
        return True


PIECES = [
    "step 10 loss 0.52\n",
    "\\u0073",
    "%2F",
    "http://u:p@",
    "task-",
    "sk-",
    "hf_",
    "AKIA",
    "xoxb-",
    "ghp_",
    "PRIVATE KEY-----",
    "é",
    "\x1b[31m",
]
SHAPES = ["sk-" + "a" * 24, "hf_" + "B" * 24, "xoxb-" + "1" * 12, "AKIA" + "Z" * 16, "ghp_" + "c" * 22]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES + SHAPES + ["supersecretvalue1"]) | st.text(max_size=12), max_size=30))
def test_the_fast_path_never_skips_what_the_full_scan_finds(parts):
    """redact's cheap needle check before the regex changes nothing: it matches the full scan."""
    redactor = Redactor([("OPENAI_API_KEY", "supersecretvalue1")])
    text = "".join(parts) + "." * 2048  # past NEEDLE_CHECK_FROM: the needle check runs
    full = Redactor([("OPENAI_API_KEY", "supersecretvalue1")])
    full._needles = full._line_needles = Everywhere()  # no fast path: the regular expressions always run
    full._chunk_scanner = full._line_scanner = None
    assert redactor.redact(text) == full.redact(text)
    line = (json.dumps({"type": "log", "text": text}, ensure_ascii=False) + "\n").encode()
    assert json.loads(redactor.redact_line(line))["text"] == redactor.redact(text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(PIECES + SHAPES + ["supersecretvalue1", "\ud800"]) | st.text(max_size=12), max_size=30
    ),
    st.booleans(),
)
def test_hyperscan_and_the_needle_tree_agree(parts, encoded):
    """The one-pass needle check (Hyperscan, on the haystack's UTF-8) finds a needle exactly when
    looking for each with `in` does, in text and in encoded lines alike."""
    from goaltender.runner.secrets import _any_in, _Needles

    values = ["supersecretvalue1", "sécret-valué"]
    needles = _Needles([v.encode() for v in values] if encoded else values, encode=encoded)
    assert needles._scanner is not None, "hyperscan is a dependency on x86-64: it must load here"
    text = "".join(parts)
    haystack = text.encode(errors="surrogatepass") if encoded else text
    assert needles.in_(haystack) == _any_in(needles.tree, haystack)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([*(piece.encode() for piece in PIECES + SHAPES), b"\xff", b"\xc3", b"\n"])
        | st.sampled_from([b"supersecretvalue1", b"secretvalue1", b"supersecret"])  # whole, and cut
        | st.binary(max_size=12),
        max_size=30,
    ),
    st.integers(0, 3000),
    st.booleans(),
    st.booleans(),
)
def test_a_raw_log_chunk_is_redacted_as_its_text(parts, padding, with_secret, hyperscan):
    """redact_edges_utf8 (a raw get_log reply's bytes) gives what redact_edges gives the chunk's
    text, encoded: on its fast path (ASCII, no needle) as on its slow one, with or without
    configured secrets, with or without Hyperscan, whatever bytes (not UTF-8 too) and pieces of
    secrets at the edges."""
    redactor = Redactor([("OPENAI_API_KEY", "supersecretvalue1")] if with_secret else [])
    if not hyperscan:  # as on a machine without its wheel
        redactor._needles._scanner = redactor._line_needles._scanner = None
    for data in (b"".join(parts), b"".join(parts) + b"." * padding, b"." * padding + b"".join(parts)):
        assert (
            redactor.redact_edges_utf8(data) == redactor.redact_edges(data.decode(errors="replace")).encode()
        )


def test_the_needle_tree_holds_every_shape_needle_under_pieces_it_contains():
    """The needle check looks for a group's shared piece first: each needle must hold it."""
    from goaltender.runner.secrets import _SHAPE_NEEDLE_TREE, _SHAPE_NEEDLES

    def leaves(nodes):
        for node in nodes:
            if isinstance(node, str):
                yield node
            else:
                piece, members = node
                inside = list(leaves(members))
                assert all(piece in needle for needle in inside), node
                yield from inside

    assert sorted(leaves(_SHAPE_NEEDLE_TREE)) == sorted(_SHAPE_NEEDLES)
    redactor = Redactor()
    for needle in _SHAPE_NEEDLES:
        text = "." * 3000 + needle + "." * 3000
        assert redactor._needles.in_(text) and redactor._line_needles.in_(text.encode())


CUT_SECRET = "Qz7VX9KP2WM4RT6YS8UV0JNB"  # none of its letters in the log around it
CUT_TOKEN = "sk-" + "ZQ" * 15  # a shape, not configured
CUT_ESCAPED = (
    CUT_SECRET[:5] + "\\u0039" + CUT_SECRET[6:14] + "\\u0036" + CUT_SECRET[15:]
)  # as JSON may write it
CUT_PASSWORD = "Wq5Jx8Vk2Zm7"  # in a URL: not configured, a URL's credentials all the same
CUT_LOG = (
    f"step 1\ntoken={CUT_SECRET}\nstep 2 {CUT_TOKEN} done\nünïcödé {CUT_SECRET}{CUT_SECRET}\n"
    f'json {{"k": "{CUT_ESCAPED}"}}\nGET http://ana:{CUT_PASSWORD}@h/x\nend\n'
)


async def test_no_piece_of_a_secret_leaves_in_a_log_chunk_of_any_size(
    start_runner, connect, tmp_path, monkeypatch
):
    """Chunks of any size at any offset: a chunk never ends or starts inside a secret (it ends at
    the secret's end and the next starts there), so small chunks could not piece one together
    (limit 8 did: redaction knew only pieces at a chunk's edges, not one wholly inside it) — nor
    inside a secret JSON-escaped, or a URL's credentials."""
    monkeypatch.setenv("MY_TOKEN", CUT_SECRET)
    agent = write_agent(
        tmp_path, "a.sh", f"goaltender experiment -d leak -- printf '%s' '{CUT_LOG}'\nsleep 60\n"
    )
    runner = await start_runner(agents={"a": agent}, secrets=["MY_TOKEN"])
    client = await connect(runner)
    goal_id = await submit(client, "leak, max 1 experiments", agent="a")

    async def logged():
        ledger = (await client.request(p.Summary(goal_id=goal_id))).ledger
        return ledger and ledger[0].status != "running" and ledger[0].id

    experiment = await eventually(logged)
    size = len(CUT_LOG.encode())
    for limit in (1, 2, 5, 8, 12, 20, 64):
        for offset in range(size + 1):
            reply = await client.request(p.GetLog(experiment_id=experiment, offset=offset, limit=limit))
            for secret in (CUT_SECRET, CUT_PASSWORD):
                for piece in (secret[i : i + 3] for i in range(len(secret) - 2)):
                    assert piece not in reply.text, (limit, offset, reply.text)
            assert "ZQZ" not in reply.text, (limit, offset, reply.text)
        # Tiled and pipelined, as text and raw, the chunks are the log redacted, whole.
        for raw in (False, True):
            tiled = b"".join(
                [bytes(r.data) async for r in client.fetch_log(experiment, chunk=limit, raw=raw)]
            )
            assert tiled.decode() == (
                CUT_LOG.replace(CUT_SECRET, "[redacted:MY_TOKEN]")
                .replace(CUT_ESCAPED, "[redacted:MY_TOKEN]")
                .replace(CUT_TOKEN, "[redacted]")
                .replace(f"ana:{CUT_PASSWORD}@", "[redacted]@")
            )


async def test_an_artifact_is_redacted_as_a_log_is(start_runner, connect, tmp_path, monkeypatch):
    """An artifact travels base64'd, which hid a secret from the redaction of the line it left in
    (the bot posted errors.json's text to Slack). Its bytes are redacted before: JSON, escaped
    forms and all, and in an image too; a file without a secret comes back byte for byte."""
    key = "sk-proj-PlantedArtifact" + "7c2e" * 6
    monkeypatch.setenv("OPENAI_API_KEY", key)  # granted by default: experiments have it
    write = (
        'import json, os, pathlib; d = pathlib.Path(os.environ["GOALTENDER_EXPERIMENT_DIR"]); k = os.environ["OPENAI_API_KEY"]; '
        'd.joinpath("errors.json").write_text(json.dumps({"text": "saw " + k + " and " + json.dumps(k)})); '
        'd.joinpath("hard_cases.png").write_bytes(b"\\x89PNG\\r\\n\\x1a\\n\\x00" + k.encode() + b"\\xff")'
    )
    agent = write_agent(tmp_path, "a.sh", f"goaltender experiment -d art -- python -c '{write}'\nsleep 60\n")
    runner = await start_runner(agents={"a": agent})
    client = await connect(runner)
    goal_id = await submit(client, "art, max 1 experiments", agent="a")

    async def done():
        ledger = (await client.request(p.Summary(goal_id=goal_id))).ledger
        return ledger and ledger[0].status != "running" and ledger[0]

    experiment = await eventually(done)
    assert experiment.exit_code == 0, experiment.note
    errors = await client.request(p.GetArtifact(experiment_id=experiment.id, name="errors.json"))
    text = base64.b64decode(errors.data).decode()
    assert key not in text and json.loads(text)["text"].startswith("saw [redacted:OPENAI_API_KEY] and ")
    image = await client.request(p.GetArtifact(experiment_id=experiment.id, name="hard_cases.png"))
    assert base64.b64decode(image.data) == b"\x89PNG\r\n\x1a\n\x00[redacted:OPENAI_API_KEY]\xff"
    clean = Path(experiment.log_path).parent / "errors.json"
    clean.write_bytes(b'{"n": 1, "\xc3\xa9": "\xff"}')  # not even UTF-8: left as it is
    again = await client.request(p.GetArtifact(experiment_id=experiment.id, name="errors.json"))
    assert base64.b64decode(again.data) == clean.read_bytes()

    # A PNG's text chunks are not its picture: they go, compressed (zTXt, iTXt) or not.
    from PIL import Image, PngImagePlugin

    picture = Image.new("RGB", (8, 4), (10, 200, 30))
    info = PngImagePlugin.PngInfo()
    info.add_text("Software", "plain " + key)
    info.add_text("Comment", "compressed " + key, zip=True)
    info.add_itxt("Description", "international " + key, zip=True)
    gallery = Path(experiment.log_path).parent / "hard_cases.png"
    picture.save(gallery, pnginfo=info)
    assert b"zTXt" in gallery.read_bytes() and b"iTXt" in gallery.read_bytes()
    served = base64.b64decode(
        (await client.request(p.GetArtifact(experiment_id=experiment.id, name="hard_cases.png"))).data
    )
    assert b"tEXt" not in served and b"zTXt" not in served and b"iTXt" not in served
    shown = Image.open(io.BytesIO(served))
    assert shown.size == (8, 4) and shown.getpixel((3, 2)) == (10, 200, 30) and not shown.text
    plain = Image.new("L", (3, 3), 7)
    plain.save(gallery)  # nothing but its picture: byte for byte
    again = await client.request(p.GetArtifact(experiment_id=experiment.id, name="hard_cases.png"))
    assert base64.b64decode(again.data) == gallery.read_bytes()


def test_what_a_process_writes_is_redacted_once_it_asks(tmp_path):
    """redact_output (goaltender fetch, the runner daemon): its prints, a library's log lines made
    after it (a handler made then, and logging's last resort), warnings and a traceback."""
    script = """
import logging, sys, warnings
from goaltender.runner.secrets import Redactor, redact_output
redact_output(Redactor.from_environment())
library = logging.getLogger("library")
library.addHandler(logging.StreamHandler())  # made after: as huggingface_hub's, imported after
library.warning("HTTP Error 429 thrown while requesting GET http://ana:Pl4nted-pass@mirror/x")
logging.getLogger("other").error("token %s", "hf_" + "Q" * 30)
print("printed http://ana:Pl4nted-pass@mirror/x")
warnings.warn("see http://ana:Pl4nted-pass@mirror/y")
raise RuntimeError("failed: http://ana:Pl4nted-pass@mirror/z " + "Pl4nted-pass")
"""
    env = {"PATH": os.environ["PATH"], "MIRROR_URL": "http://ana:Pl4nted-pass@mirror"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert (
        out.returncode == 1
        and "RuntimeError: failed: http://[redacted]@mirror/z [redacted:MIRROR_URL]" in out.stderr
    )
    assert "GET http://[redacted]@mirror/x" in out.stderr and "token [redacted]" in out.stderr
    assert (
        out.stdout == "printed http://[redacted]@mirror/x\n"
        and "see http://[redacted]@mirror/y" in out.stderr
    )
    assert "Pl4nted" not in out.stdout + out.stderr and "QQQQ" not in out.stderr
