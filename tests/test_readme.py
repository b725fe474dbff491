"""The README's commands: every `dbn` command in its shell blocks is a valid command line,
names files that exist, and the cheap ones run (the quick evaluation runs in
test_mnist_eval.py, the test suite in .ci/run)."""

import re
import shlex
from pathlib import Path

import pytest

from dbn.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def shell_lines() -> list[str]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        if "[--" in block:  # the synopsis of every command, not runnable as such
            continue
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line:
                lines.append(line)
    return lines


def dbn_commands() -> list[list[str]]:
    commands = []
    for line in shell_lines():
        for part in line.split("&&"):
            words = shlex.split(part)
            if words and words[0] in ("dbn", ".venv/bin/dbn"):
                commands.append(words[1:])
    return commands


def test_the_readme_opens_with_the_two_setup_commands():
    first = shell_lines()[:2]
    assert first == ["bash bootstrap.sh && .venv/bin/dbn mnist", "bash bootstrap.sh && .venv/bin/python -m pytest"]
    assert (ROOT / ".ci" / "run").read_text().count(".venv/bin/python -m pytest") == 1


@pytest.mark.parametrize("args", dbn_commands(), ids=" ".join)
def test_every_dbn_command_parses_and_its_files_exist(args):
    parsed = build_parser().parse_args([a.replace("APP_ID", "application_1_0001") for a in args])
    for value in vars(parsed).values():
        if isinstance(value, (str, Path)) and str(value).startswith("examples/"):
            assert (ROOT / value).is_file(), value


def test_the_dry_run_in_the_readme_runs(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert ["submit", "examples/yarn.toml", "--dry-run"] in dbn_commands()
    assert main(["submit", "examples/yarn.toml", "--dry-run"]) == 0
    assert "iterreduce.yarn.container master job.json" in capsys.readouterr().out


def test_every_image_and_local_link_in_the_readme_exists():
    targets = re.findall(r"\]\(([^)#\s]+)\)", README)
    local = [t for t in targets if "://" not in t]
    assert "docs/live-view.png" in local
    for target in local:
        assert (ROOT / target).exists(), target


def test_every_job_setting_is_in_the_readmes_tables():
    """A key of the job file (every section, the [model] keys generated from DBN's signature)
    that the README's settings tables leave out is a setting users cannot find."""
    import dataclasses

    from dbn.jobs.spec import SECTIONS

    documented = set()
    for line in README.splitlines():
        if not line.startswith("| `"):
            continue
        names = re.findall(r"`([^`]+)`", line.split("|")[1])
        section = names[0].partition(".")[0] if "." in names[0] else None
        # "`model.momentum` / `final_momentum`": the later names share the first one's section
        documented |= {name if "." in name else f"{section}.{name}" for name in names if section}
    keys = {f"{name}.{field.name}" for name, section in SECTIONS.items() for field in dataclasses.fields(section)}
    assert not sorted(keys - documented)
