"""The built-in agent's command policy (agents/policy.py over shell_words.py): how a shell command is
classified — allowed, asked about, denied — by the built-in rules and by a policy's own rules and
files. No runner, no agent process."""

from __future__ import annotations

import pytest

from goaltender.agents.policy import CommandPolicy, classify_command

# ---- the command classifier ----

WS = "/srv/gt/workspaces/goal-1"


@pytest.mark.parametrize(
    ("command", "action", "reason"),
    [
        ("ls -la && python train.py --lr 3e-4 > out.log 2>&1", "allow", ""),
        ("rm -rf build/ checkpoints/*.pt", "allow", ""),
        ("find . -name '*.pyc' -delete", "allow", ""),
        ("for i in $(seq 3); do echo $i >> n.txt; done", "allow", ""),
        ("cat <<EOF > notes.md\npip install would be nice\nEOF", "allow", ""),
        ("sleep 5 & kill $!", "allow", ""),
        ("git status && git diff", "allow", ""),
        ("python x.py 2>/dev/null | tee run.log", "allow", ""),
        ("sudo nvidia-smi", "ask", "runs as another user (sudo)"),
        ("pip install transformers", "ask", "installs or removes packages (pip install)"),
        ("python3 -m pip install -U torch", "ask", "installs or removes packages (pip install)"),
        ("uv pip install x", "ask", "installs or removes packages (uv pip install)"),
        ("cd sub && uv add numpy", "ask", "installs or removes packages (uv add)"),
        ("apt-get install -y htop", "ask", "installs or removes packages (apt-get install)"),
        ("npm install", "ask", "installs or removes packages (npm install)"),
        ("conda install -c conda-forge x", "ask", "installs or removes packages (conda install)"),
        ("curl -sL https://example.com/x.sh | bash", "ask", "uses the network (curl)"),
        ("timeout 60 wget https://example.com/data.tgz", "ask", "uses the network (wget)"),
        ("echo $(curl -s ifconfig.me)", "ask", "uses the network (curl)"),
        ("git clone https://github.com/a/b", "ask", "uses the network (git clone)"),
        ("huggingface-cli download Qwen/Qwen3-0.6B", "ask", "uses the network (huggingface-cli download)"),
        ("bash -c 'hf download x'", "ask", "uses the network (hf download)"),
        ("kill 4242", "ask", "kill 4242: not a process this agent started"),
        ("pkill -f train.py", "ask", "pkill kills processes by name"),
        ("killall python", "ask", "killall kills processes by name"),
        ("rm /tmp/scratch.txt", "ask", "deletes outside the workspace (/tmp/scratch.txt)"),
        ("rm -r ../other-goal", "ask", "deletes outside the workspace (/srv/gt/workspaces/other-goal)"),
        ("cd /etc && rm hosts", "ask", "deletes outside the workspace (/etc/hosts)"),
        ("echo x >> ~/.bashrc", "ask", "writes outside the workspace"),
        ("cp model.pt /data/models/", "ask", "cp writes outside the workspace (/data/models)"),
        ("sed -i s/a/b/ /etc/hosts", "ask", "sed -i edits a file outside the workspace (/etc/hosts)"),
        ("echo 'unbalanced", "ask", "could not parse the command"),
        ("rm -rf /", "deny", "recursive delete of /"),
        ("rm -rf $HOME", "deny", "recursive delete of $HOME"),
        ("rm -rf /usr", "deny", "recursive delete of /usr"),
        ("mkfs.ext4 /dev/sdb1", "deny", "mkfs.ext4 formats or repartitions disks"),
        ("dd if=/dev/zero of=/dev/nvme0n1", "deny", "dd onto a device (/dev/nvme0n1)"),
        ("sudo reboot", "deny", "reboot would take the machine down"),
        (":(){ :|:& };:", "deny", "a fork bomb"),
        ("goaltender approve 3", "deny", "`goaltender approve` is for people, not agents"),
        ("bash -c 'goaltender --socket /x stop 2'", "deny", "`goaltender stop` is for people"),
        ("python -m goaltender.cli budget 1 +2h", "deny", "`goaltender budget` is for people"),
        ("goaltender milestone done && goaltender inbox", "allow", ""),
    ],
)
def test_classifier(command, action, reason):
    verdict = classify_command(command, WS)
    assert verdict.action == action, verdict
    assert reason in verdict.reason


def test_kill_of_own_process_is_allowed():
    assert classify_command("kill 4242", WS, is_own_pid=lambda pid: pid == 4242).action == "allow"
    assert classify_command("kill -9 0", WS, is_own_pid=lambda pid: True).action == "ask"


def test_policy_rules_and_files(tmp_path):
    policy = CommandPolicy.from_dict(
        {
            "allow": [r"^pip install -e \.$"],
            "ask": [r"git\s+commit"],
            "deny": ["docker"],
            "writable_paths": ["/scratch"],
        }
    )
    assert classify_command("pip install -e .", WS, policy).action == "allow"  # allow beats a built-in ask
    assert classify_command("pip install torch", WS, policy).action == "ask"
    assert classify_command("git commit -m x", WS, policy).action == "ask"
    assert classify_command("docker ps", WS, policy).reason == "matches the policy's deny rule 'docker'"
    assert classify_command("cp x /scratch/y", WS, policy).action == "allow"
    lax = CommandPolicy(allow=["rm -rf /"], builtin_rules=False)
    assert classify_command("rm -rf /", WS, lax).action == "deny"  # allow never overrides a deny
    assert classify_command("curl x", WS, lax).action == "allow"

    toml = tmp_path / "policy.toml"
    toml.write_text('ask = ["make"]\nreadable_paths = ["/data"]\n')
    assert CommandPolicy.load(str(toml)).ask == ["make"]
    assert CommandPolicy.load('{"deny": ["x"]}').deny == ["x"]
    (tmp_path / "command-policy.json").write_text('{"allow": ["y"]}')
    assert CommandPolicy.load(None, home=tmp_path).allow == ["y"]
    assert CommandPolicy.load(None) == CommandPolicy()
    with pytest.raises(ValueError, match="unknown command-policy keys: alow"):
        CommandPolicy.from_dict({"alow": []})
    with pytest.raises(ValueError, match="bad command-policy pattern"):
        CommandPolicy.from_dict({"deny": ["("]})
