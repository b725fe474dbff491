"""The job file's reference, generated from the spec: ``docs/settings.md``.

    python -m dbn.jobs.reference > docs/settings.md

Every section and key comes from :data:`dbn.jobs.sections.SECTIONS` (``[model]`` from
``DBN.__init__``'s signature), with its type, its allowed values (:data:`dbn.jobs.sections.CHOICES`),
its default and what it means (its field's help, written once beside it); the command-line flags
that set a key come from ``dbn``'s own parser. :func:`undescribed` and :func:`stale` name the keys
without a meaning and the meanings of ``[model]`` keys that are gone, and :func:`render` refuses to
write a reference with either (``tests/test_readme.py`` checks both, and that ``docs/settings.md``
is this module's output).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import textwrap
import types
import typing
from typing import Any

from .sections import CHOICES, MODEL_HELP, SECTIONS

REGENERATE = "python -m dbn.jobs.reference > docs/settings.md"

#: The page's first paragraphs.
INTRODUCTION = (
    "One TOML file describes a job, for `dbn train` and `dbn submit` alike (see `examples/mnist.toml`, "
    "`examples/quick.toml` and `examples/yarn.toml`). Unknown keys and wrong types are refused with the "
    "file, section and key named. Command-line flags override the file, and `--set section.key=value` "
    "overrides any key (`--set model.hidden_layers=[200,100]`, `--set cluster.reduce=master`).",
    "In Python the job is a `dbn.jobs.spec.JobSpec`: `load_spec(\"job.toml\", {\"model.pretrain_epochs\": 5})`, "
    "`JobSpec.from_dict(d)`, `spec.to_dict()` (what `config.json` and the YARN job file hold) and "
    "`spec.to_toml()`; every value is checked once, on the way in. `dbn.jobs.run.run(spec, launcher)` "
    "trains it with `InProcess()`, `MiniCluster()` or `Yarn(report_dir)` and returns the result that "
    "`result.json` holds, whichever launcher ran it.",
    "A default of `none` means that the key is unset (left out of the file; `--set section.key=none` "
    "on the command line); its meaning says what that does. The flags column names the commands that "
    "take each flag.",
)

#: What each section is for, above its table.
SECTION_NOTES = {
    "data": "What the job trains on, and what it is tested on once at the end. Relative paths are "
            "relative to the job file. A table (a directory of Parquet or ORC files as Spark or Hive "
            "write them, local or `hdfs://`, `s3://`) is read in place when `features` is set; "
            "[data.md](data.md) says how.",
    "model": "The DBN's hyperparameters. This section is generated from the signature of `dbn.DBN`, so "
             "its keys and defaults are the estimator's own (`seed` and `device` are in `[job]`). The "
             "defaults are Hinton's MNIST recipe; `dbn mnist` and the examples set more (see "
             "`examples/mnist.toml`, `examples/mnist-dropout.toml`).",
    "output": "Where a run writes its model, `result.json`, `log.jsonl`, checkpoints and logs. A relative "
              "path is relative to the current directory; a YARN job's must be an `hdfs://` URI.",
    "job": "The run's name, seed and device.",
    "cluster": "Distributed training: the workers, how often and how they average, faults, streaming and "
               "the live page. With `workers = 0` the job trains in this process and most keys here do not "
               "apply. [design.md](design.md) says how the runtime works.",
    "yarn": "Resources and placement on YARN (`dbn submit`); the worker count is `[cluster] workers`. "
            "[yarn.md](yarn.md) and [kerberos.md](kerberos.md) say more.",
}

_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", tuple: "list"}


def keys() -> list[str]:
    """Every ``section.key`` of the job file, in the spec's order."""
    return [f"{name}.{field.name}" for name, section in SECTIONS.items() for field in dataclasses.fields(section)]


def describe(key: str) -> str:
    """What ``section.key`` means: its field's :func:`~iterreduce.specification.setting` help."""
    section, _, name = key.partition(".")
    return SECTIONS[section].help(name)


def undescribed() -> list[str]:
    """Keys of the spec whose field says nothing of what it means."""
    return [key for key in keys() if not describe(key).strip()]


def stale() -> list[str]:
    """Keys :data:`dbn.jobs.sections.MODEL_HELP` describes that ``DBN.__init__`` no longer takes (the
    other sections' meanings are their fields' own, so they go with them)."""
    return [f"model.{name}" for name in MODEL_HELP if name not in SECTIONS["model"].names()]


def type_name(hint) -> str:
    """A type hint in words: ``str | None`` -> "string", ``tuple[str, ...]`` -> "list of strings"."""
    if isinstance(hint, str):
        return hint
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(m) for m in typing.get_args(hint) if m is not type(None)]
        return " or ".join(dict.fromkeys(names))
    if origin in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return f"list of {type_name(args[0])}s" if args else "list"
    if hint is Any:
        return "any"
    return _TYPE_NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def toml_value(value) -> str:
    """A default as a job file writes it; none where unset."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def flags() -> dict[str, list[str]]:
    """The command-line flags that set each key, from ``dbn``'s parser: a flag whose destination is the
    key, or whose help names it in parentheses (``--local N``: "... (cluster.workers)")."""
    from ..cli import build_parser  # the command line sits above the jobs: imported only to read it

    known, found = set(keys()), {}

    def walk(parser, command):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{command} {name}".strip())
                continue
            if not action.option_strings:
                continue
            named = re.findall(r"\(([a-z]+\.[a-z0-9_]+)\)", action.help or "")
            key = action.dest if action.dest in known else next((k for k in named if k in known), None)
            if key is None and action.help and action.help.split(" ")[0] in known:  # "output.dir (default ...)"
                key = action.help.split(" ")[0]
            if key is not None:
                flag = max(action.option_strings, key=len)
                found.setdefault(key, {}).setdefault(flag, []).append(command.split(" ")[0])

    walk(build_parser(), "")
    commands = {key: {flag: sorted(set(cmds)) for flag, cmds in by_flag.items()} for key, by_flag in found.items()}
    return {key: [f"`{flag}` ({', '.join(cmds)})" for flag, cmds in sorted(by_flag.items())]
            for key, by_flag in commands.items()}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _paragraph(text: str) -> list[str]:
    return textwrap.wrap(text, width=100, break_long_words=False, break_on_hyphens=False) + [""]


def _kind(section: str, field: dataclasses.Field, hint) -> str:
    """The key's type in words, or its allowed values."""
    choices = CHOICES.get((section, field.name))
    if choices:
        return " or ".join(f'`"{c}"`' for c in choices)
    kind = type_name(hint)
    if kind == "list" and isinstance(field.default, tuple) and field.default:  # an unannotated list: its default says
        kind = f"list of {type_name(type(field.default[0]))}s"
    return kind


def render() -> str:
    """The markdown of ``docs/settings.md``: every section and key of the job file. Raises ValueError
    when a key of the spec has no description, or a description names a key that is gone."""
    missing, gone = undescribed(), stale()
    if missing or gone:
        raise ValueError(f"dbn/jobs/sections.py: describe {missing or 'nothing more'} (setting(..., help=...), "
                         f"MODEL_HELP for [model]); drop {gone or 'nothing'} from MODEL_HELP")
    by_key = flags()
    lines = ["# Job file settings", "",
             f"<!-- Generated from dbn/jobs/sections.py by `{REGENERATE}`: edit the settings' help there, "
             "not this file. -->", ""]
    for text in INTRODUCTION:
        lines += _paragraph(text)
    hints_of = {name: typing.get_type_hints(section) for name, section in SECTIONS.items()}
    for name, section in SECTIONS.items():
        lines += [f"## [{name}]", "", *_paragraph(SECTION_NOTES[name]),
                  "| key | type | default | flags | meaning |", "| --- | --- | --- | --- | --- |"]
        for field in dataclasses.fields(section):
            key = f"{name}.{field.name}"
            lines.append(f"| `{key}` | {_kind(name, field, hints_of[name][field.name])} | "
                         f"`{toml_value(field.default)}` | {'<br>'.join(by_key.get(key, []))} | "
                         f"{_cell(describe(key))} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
