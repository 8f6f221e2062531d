"""Shared option aliases: each command that takes one shows the same flag and help."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from kvtier.cli.options import JsonOnStdout, Mfu, ModelPreset, Strict


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.command("one")
    def one(model: ModelPreset = "a", json_out: JsonOnStdout = False, strict: Strict = False):
        typer.echo(f"{model} {json_out} {strict}")

    @app.command("two")
    def two(model: ModelPreset = "b", mfu: Mfu = 0.5):
        typer.echo(f"{model} {mfu}")

    return app


def test_one_alias_serves_several_commands_with_their_own_defaults():
    runner = CliRunner()
    app = _app()
    assert runner.invoke(app, ["one", "-m", "x", "--json", "--strict"]).output == "x True True\n"
    assert runner.invoke(app, ["one"]).output == "a False False\n"
    assert runner.invoke(app, ["two", "--mfu", "0.25"]).output == "b 0.25\n"


def test_the_alias_carries_its_flags_and_help():
    result = CliRunner().invoke(_app(), ["two", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--model" in result.output and "-m" in result.output
    assert "Preset name or path of a HF config.json." in result.output
    assert "Prefill FLOP utilisation." in result.output


def _commands(group, path=()):
    """Every command of the kvtier app (lazily loaded groups too), with its name path."""
    ctx = group.context_class(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if hasattr(command, "list_commands"):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


def test_no_help_text_loses_words_to_rich_markup():
    """rich reads ``[word]`` in a help text as markup and drops it: every option's help must
    print as written (defaults go in parentheses)."""
    import typer.main
    from rich.text import Text

    from kvtier.cli.main import cli

    lost = []
    for path, command in _commands(typer.main.get_command(cli)):
        for param in command.params:
            help_text = getattr(param, "help", None) or ""
            if Text.from_markup(help_text).plain != help_text:
                lost.append(f"kvtier {' '.join(path)} {param.opts[0]}: {help_text!r}")
    assert not lost, "\n".join(lost)
