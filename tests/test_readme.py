"""The README and the reference in docs/: the two set-up commands come first and `.ci/run` runs the
same test command; the main job's command installs only what the main job needs; every `dbn`
command in their shell blocks is a valid command line and names files that exist, and the cheap
ones run (the quick evaluation runs in test_mnist_eval.py, the test suite in .ci/run); every local
link and anchor resolves; docs/settings.md is the reference generated from the job spec, with every
key described."""

import dataclasses
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from dbn.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
MAIN_JOB = "bash bootstrap.sh && .venv/bin/dbn mnist"


def shell_lines(text: str = README) -> list[str]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        if "[--" in block:  # the synopsis of every command, not runnable as such
            continue
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line:
                lines.append(line)
    return lines


def dbn_commands(pages=PAGES) -> list[list[str]]:
    commands = []
    for page in pages:
        for line in shell_lines(page.read_text()):
            for part in re.split(r"&&|;", line):
                words = shlex.split(part)
                if words and words[0] in ("dbn", ".venv/bin/dbn"):
                    commands.append(words[1:])
    return commands


def test_the_readme_opens_with_the_two_setup_commands_and_ci_runs_the_same_test_command():
    main_job, tests = shell_lines()[:2]
    assert main_job == MAIN_JOB
    assert tests.startswith("bash bootstrap.sh test && .venv/bin/python -m pytest"), tests
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == tests, "the README's test command and .ci/run's last line must be the same command"


def test_the_main_jobs_command_installs_only_what_the_main_job_needs():
    """`bash bootstrap.sh` (no argument) installs the package with the extras `dbn mnist` needs
    (matplotlib for its plots) and neither the test extras nor Debian's packages, which only
    `bash bootstrap.sh test` installs."""
    script = (ROOT / "bootstrap.sh").read_text()
    default = re.search(r'extras="\$\{1:-([^}]*)\}"', script).group(1).split(",")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "test" not in default and set(default) <= set(extras), default
    names = {re.split(r"[<>=\[ ;]", req, maxsplit=1)[0] for extra in default for req in extras[extra]}
    assert "matplotlib" in names  # dbn mnist draws its plots with it (dbn/jobs/plots.py)
    assert not names & {"pytest", "selenium", "hypothesis", "hdfs-native"}, names
    assert "from matplotlib" in (ROOT / "dbn" / "jobs" / "plots.py").read_text()
    # every apt-get install sits inside an `if` on the test extra
    depth_of_test_block, depth = None, 0
    installs = 0
    for line in script.splitlines():
        code = line.split("#", 1)[0].strip()
        if re.match(r"if\b", code):
            depth += 1
            if '",test,"' in code and depth_of_test_block is None:
                depth_of_test_block = depth
        if "apt-get" in code and "install" in code:
            installs += 1
            assert depth_of_test_block is not None and depth >= depth_of_test_block, line
        if re.match(r"fi\b", code):
            if depth == depth_of_test_block:
                depth_of_test_block = None
            depth -= 1
    assert installs == 2  # chromium, MIT Kerberos


@pytest.mark.parametrize("args", dbn_commands(), ids=" ".join)
def test_every_dbn_command_parses_and_its_files_exist(args):
    parsed = build_parser().parse_args([a.replace("APP_ID", "application_1_0001") for a in args])
    for value in vars(parsed).values():
        if isinstance(value, (str, Path)) and str(value).startswith("examples/"):
            assert (ROOT / value).is_file(), value


def test_the_dry_run_in_the_readme_runs(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert ["submit", "examples/yarn.toml", "--dry-run"] in dbn_commands([ROOT / "README.md"])
    assert main(["submit", "examples/yarn.toml", "--dry-run"]) == 0
    assert "iterreduce.launch.yarn.container master job.json" in capsys.readouterr().out


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a markdown page's headings."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_image_local_link_and_anchor_exists(page):
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    local = [t for t in targets if "://" not in t]
    if page.name == "README.md":
        assert "docs/live-view.png" in local
        assert {f"docs/{doc.name}" for doc in DOCS} <= set(local), "the README links every page of docs/"
    for target in local:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), target
        if anchor:
            assert anchor in anchors(file), target


def test_the_readme_is_short():
    lines = README.splitlines()
    assert len(lines) <= 250
    assert [n for n, line in enumerate(lines, 1) if len(line) > 200] == []


def test_every_job_setting_is_described_once_and_no_description_is_stale():
    """A key of the job file (every section, the [model] keys generated from DBN's signature)
    without a description is a setting users cannot find; a description of a key that is gone
    describes nothing."""
    from dbn.jobs import reference

    assert reference.undescribed() == [], "describe these in dbn/jobs/sections.py (setting(..., help=...), MODEL_HELP)"
    assert reference.stale() == [], "these keys are gone from DBN.__init__: drop them from MODEL_HELP"


def test_the_settings_reference_is_generated_from_the_spec():
    from dbn.jobs import reference

    assert (ROOT / "docs" / "settings.md").read_text() == reference.render(), (
        f"docs/settings.md is not the spec's reference: run `{reference.REGENERATE}`")


def test_every_job_setting_is_in_the_settings_tables():
    """Each key of the job file has its row in docs/settings.md, and each row is a key."""
    from dbn.jobs.spec import SECTIONS

    settings = (ROOT / "docs" / "settings.md").read_text()
    documented = re.findall(r"^\| `([a-z_]+\.[a-z0-9_]+)` \|", settings, flags=re.M)
    keys = [f"{name}.{field.name}" for name, section in SECTIONS.items() for field in dataclasses.fields(section)]
    assert sorted(documented) == sorted(keys)
