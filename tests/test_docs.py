"""The documentation: generated reference pages that match the code, --help examples that parse,
no issue numbers where users read."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from gpubench.commands import EXAMPLES, EXIT_CODES, build_parser, iter_commands
from gpubench.docgen import PAGES, main, stale
from tests.conftest import REPO


def test_the_reference_pages_are_what_the_code_generates(tmp_path, capsys):
    assert stale() == [], "regenerate with: python -m gpubench.docgen"
    # the check names a stale page and fails; writing the pages makes it pass
    assert main(["--out", str(tmp_path)]) == 0
    (tmp_path / "cli.md").write_text((tmp_path / "cli.md").read_text().replace("gpubench run", "gpubench walk", 1))
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == f"{tmp_path / 'cli.md'}: out of date; regenerate with: python -m " \
                                              "gpubench.docgen"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PAGES)


def test_the_generated_pages_format_defaults_as_a_suite_writes_them():
    assert len(list(iter_commands(build_parser()))) > 20
    keys = (REPO / "docs" / "reference" / "suite-keys.md").read_text()
    assert "| `depth` | `mlp` | `2` | `1` |" in keys
    assert "| `batch_size` | `64` |" in keys and "| `framework` | `\"torch\"` |" in keys


def test_each_suite_keys_help_names_every_value_it_allows():
    # in a fresh interpreter: gpubench's own values (a plugin loaded by another test adds some)
    code = ("from gpubench.settings import SETTINGS, Choice\n"
            "from gpubench.workloads import WORKLOADS\n"
            "for s in SETTINGS.values():\n"
            "    if isinstance(s.check, Choice):\n"
            "        print(s.name, *s.check.values())\n"
            "print('workload', *WORKLOADS)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
                         env={k: v for k, v in os.environ.items() if k != "GPUBENCH_PLUGINS"}).stdout
    from gpubench.settings import SETTINGS

    allowed = {name: values for name, *values in (line.split() for line in out.splitlines())}
    builtins = allowed.pop("workload")
    assert len(builtins) >= 6 and all(len(allowed.get(k, [])) >= 2 for k in ("optimizer", "precision", "compile", "pipeline_schedule"))
    missing = [f"{name}: {v}" for name, values in allowed.items() for v in values
               if f"`{v}`" not in SETTINGS[name].help]
    assert missing == []
    # the workload is a built-in, a factory or a zoo's model: its help names each built-in and zoo
    from gpubench.workloads.source import ZOOS

    assert [w for w in builtins if f"`{w}`" not in SETTINGS["workload"].help] == []  # the registry's, every one
    assert [z for z in ZOOS if f'`"{z}:' not in SETTINGS["workload"].help] == []


@pytest.mark.parametrize("words", sorted(EXAMPLES))
def test_each_commands_help_ends_with_examples_that_parse(words, capsys):
    examples = EXAMPLES[words]
    assert 2 <= len(examples) <= 3, words
    parser = dict(iter_commands(build_parser()))[words]
    codes = EXIT_CODES.get(words)
    tail = "\n\nexit codes:\n" + "\n".join(f"  {c}" for c in codes) if codes else ""
    assert parser.format_help().rstrip().endswith("examples:\n" + "\n".join(f"  {e}" for e in examples) + tail)
    for example in examples:
        argv = shlex.split(example, comments=True)
        assert argv[0] == "gpubench"
        if argv[1:] == ["run", "--help"]:
            continue
        build_parser().parse_args(argv[1:])  # an unknown option or value exits 2 here


def test_every_command_has_examples_and_each_that_acts_its_exit_codes():
    commands = sorted(words for words, _ in iter_commands(build_parser()))
    assert commands == sorted(EXAMPLES)
    groups = {"", "baseline", "history"}  # they only name a sub-command
    assert sorted(EXIT_CODES) == [w for w in commands if w not in groups]
    for words, codes in EXIT_CODES.items():  # each code once, in order; bad input everywhere
        numbers = [int(c.split()[0].rstrip(",")) for c in codes]
        assert numbers == sorted(set(numbers)) and 2 in numbers, words


ISSUE = re.compile(r"\bissues? ?#?\d+|(?<![\w/&#])#\d+\b", re.IGNORECASE)


def test_no_user_facing_text_names_an_issue():
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "suites").glob("*.toml")),
             REPO / "scripts" / "gpu_check.sh"]
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()[:80]}" for path in files
             for n, line in enumerate(path.read_text().splitlines(), 1) if ISSUE.search(line)]
    assert found == []
    assert ISSUE.search("see issue 8") and ISSUE.search("(#7)") and not ISSUE.search("[a](#under-slurm)")


def _gpubench_commands(text: str) -> list[list[str]]:
    """The `python -m gpubench ...` commands of a page's bash blocks, continuation lines joined,
    chains (`a && b`, `a; b`) split."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for command in re.split(r"&&|;", line):
                argv = shlex.split(command, comments=True)
                if argv[:3] == ["python", "-m", "gpubench"]:
                    commands.append(argv[3:])
    return commands


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md", "docs/index.md", "docs/running.md",
                                  "docs/distributed.md"])
def test_the_commands_a_newcomer_copies_parse(page):
    commands = _gpubench_commands((REPO / page).read_text())
    assert commands
    for argv in commands:
        build_parser().parse_args(argv)  # an unknown command, option or value exits 2 here


def test_the_readme_is_short_and_shows_seven_recipes():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 170
    recipes = readme.split("## Recipes", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"^\*\*[^*]+\*\*", recipes, re.M)) == 7
    assert len(_gpubench_commands(recipes)) >= 7


def test_option_lists_are_the_registries_and_every_measuring_command_takes_a_launcher():
    """The names a command's option lists (in its choices or its help) are exactly the
    registries' (none missing, none that does not exist), and every command that measures takes
    the same --launcher options."""
    from gpubench.advise.practices import GROUPS
    from gpubench.gate.compare import CORRECTIONS
    from gpubench.gate.export import FORMATS
    from gpubench.runner.session import LAUNCHERS

    options = {(words, o): a for words, p in iter_commands(build_parser()) for a in p._actions for o in a.option_strings}
    assert options[("advise", "--only")].help.split("(repeatable): ")[1].split(", ") == list(GROUPS)
    assert tuple(options[("export", "--format")].choices) == FORMATS
    assert tuple(options[("compare", "--correction")].choices) == tuple(options[("ab", "--correction")].choices) \
        == CORRECTIONS
    for command in ("run", "ab", "advise", "profile", "find-batch"):
        assert list(options[(command, "--launcher")].choices) == list(LAUNCHERS), command
        assert all((command, o) in options for o in ("--partition", "--max-parallel", "--sbatch-arg")), command
