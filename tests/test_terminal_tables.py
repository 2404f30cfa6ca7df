"""The terminal's tables at any width: a config id of 90 characters once made every column of
the summary an ellipsis at 80 columns, and `ab`'s verdict unreadable (fmt.fitted)."""

from __future__ import annotations

from rich.console import Console

from gpubench.config import Config
from gpubench.fmt import short_names
from tests.conftest import make_result

LONG = dict(workload="mlp", framework="torch", batches="gptfactory.token_batches_with_targets",
            loss="gptfactory.a_loss_of_my_own_with_a_long_name")


def test_short_names_drop_what_every_id_shares_and_stay_apart():
    ids = ["gpt.gpt-torch-cpu-bs16-fp32-single-loss_output=1", "gpt.gpt-torch-cpu-bs16-amp-bf16-single-loss_output=1"]
    assert short_names(ids) == {ids[0]: "fp32", ids[1]: "amp-bf16"}
    assert short_names(["mynet.net-torch-cpu-bs256-fp32-single"]) == {"mynet.net-torch-cpu-bs256-fp32-single":
                                                                        "mynet.net"}
    long = ["a" * 30 + "b-torch", "a" * 30 + "c-torch"]  # what differs lies past the cut: numbered
    names = short_names(long, limit=24)
    assert names == {long[0]: "#1 " + "a" * 23 + "…", long[1]: "#2 " + "a" * 23 + "…"}


def _console(width: int) -> Console:
    return Console(width=width, record=True, color_system=None)


def test_the_summary_keeps_every_figure_whole_at_80_columns():
    from gpubench.runner.progress import print_summary

    results = [make_result(Config(**LONG, batch_size=b), rate=1234.5 * b) for b in (8, 16)]
    console = _console(80)
    print_summary(console, results)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines() if line.startswith(("┃", "│"))) <= 80
    assert "…" not in "".join(line for line in text.splitlines() if line.startswith("│"))  # no figure cut
    assert "│ bs8 " in text and "9.88k" in text and "19.8k" in text
    assert f"  bs8 = {results[0].config_id}" in text and f"  bs16 = {results[1].config_id}" in text
    assert "left out at this terminal's width (80 columns): cold" in text
    wide = _console(400)
    print_summary(wide, results)  # where the ids fit: the table as it always was, nothing below it
    text = wide.export_text()
    assert results[0].config_id in text and "config ids:" not in text


def test_the_gate_keeps_the_verdict_and_its_interval_whole_at_80_columns():
    from gpubench.gate.compare import compare
    from gpubench.gate.render import show

    config = Config(**LONG, batch_size=8)
    base = [make_result(config, rate=1000.0 + r, repeat=r) for r in range(6)]
    cur = [make_result(config, rate=700.0 + r, repeat=r) for r in range(6)]
    c = compare(base, cur, alpha=0.05)
    console = _console(80)
    show(console, c, ("baseline", "candidate"), base, cur, "reproduce")
    text = console.export_text()
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert len(rows) == 1 and "regressed" in rows[0] and "-29.9% [-30.1%, -29.7%]" in rows[0] and "…" not in rows[0]
    assert f"  mlp = {config.config_id}" in text


def test_below_a_usable_width_a_table_is_one_record_per_line():
    from gpubench.cli import Terminal
    from gpubench.runner.progress import print_summary

    results = [make_result(Config(**LONG, batch_size=b), rate=1234.5 * b) for b in (8, 16)]
    console = Terminal(width=20, record=True, color_system=None)
    print_summary(console, results)
    text = console.export_text(styles=False)
    assert "│" not in text and "…" not in text  # no columns of ellipses
    lines = text.splitlines()
    for r in results:  # each config whole on its line, its figures below it
        assert f"config: {r.config_id}" in lines
    assert "samples/s: 9.88k" in lines and "samples/s: 19.8k" in lines and "status: ok" in lines


def _table(n: int):
    from rich.table import Table

    table = Table(title="t")
    for col in ("workload", "description"):
        table.add_column(col)
    for i in range(n):
        table.add_row("cnn", "a description of the workload that is long enough to fill a wide terminal " * 2)
    return table


def test_columns_is_honoured_piped_or_not_and_a_line_is_never_broken(monkeypatch):
    import io

    from gpubench.cli import Terminal

    def printed(columns: str | None) -> list[str]:
        monkeypatch.delenv("COLUMNS", raising=False)
        if columns:
            monkeypatch.setenv("COLUMNS", columns)
        out = io.StringIO()  # piped: not a terminal
        console = Terminal(file=out, color_system=None)
        console.print(_table(2))
        console.print("report: /" + "d" * 120 + "/index.html")  # a path longer than the width: whole
        return [line for line in out.getvalue().splitlines() if line.strip()]

    piped = printed("100")
    assert max(len(line) for line in piped if line[0] in "┏┃┡│└") <= 100
    assert "report: /" + "d" * 120 + "/index.html" in piped  # on one line, as a user copies it
    assert max(len(line) for line in printed(None) if line[0] in "┏┃┡│└") > 100  # piped, no COLUMNS: 160
    narrow = printed("20")
    assert "workload: cnn" in narrow and not any(line[0] in "┏┃┡│└" for line in narrow)


def test_a_terminal_of_no_width_still_prints(tmp_path):
    # a pseudo-terminal that reports no size (0 x 0, as some CI runners' are): the CLI's console
    # (gpubench.cli.Terminal, what every command prints to) lays its tables out at 80
    import os
    import pty
    import subprocess
    import sys

    from tests.conftest import plugin_env

    primary, secondary = pty.openpty()
    env = {k: v for k, v in plugin_env().items() if k != "COLUMNS"}
    script = ("from gpubench.cli import Terminal; from tests.test_terminal_tables import _table; "
              "c = Terminal(); print(c.width); c.print(_table(1))")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd(), env=env, stdout=secondary,
                            stderr=subprocess.STDOUT)
    os.close(secondary)
    out = b""
    while _readable(primary):
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child has closed its end
            break
        if not chunk:
            break
        out += chunk
    os.close(primary)
    proc.wait(timeout=120)
    text = out.decode(errors="replace")
    assert proc.returncode == 0 and text.splitlines()[0].strip() == "80" and "cnn" in text, text[-500:]


def _readable(fd: int) -> bool:
    import select

    try:
        return bool(select.select([fd], [], [], 60)[0])
    except OSError:
        return False
