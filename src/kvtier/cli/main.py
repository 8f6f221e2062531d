"""Entry point of the ``kvtier`` command: one typer app, one module per sub-command.

Command modules import only typer/rich at module level; heavy libraries (torch, matplotlib)
are imported inside the command so that ``kvtier plan`` answers fast.
"""

from __future__ import annotations

import sys

import typer

from kvtier.errors import KvtierError

cli = typer.Typer(
    name="kvtier",
    help="Tiered KV cache for long-context LLM serving: plan, simulate, bench, calibrate, run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from kvtier.cli import bench_cmd, calibrate_cmd, plan_cmd, run_cmd, simulate_cmd

    for module in (plan_cmd, bench_cmd, calibrate_cmd, run_cmd, simulate_cmd):
        module.register(cli)


_register()


def app() -> None:
    """Run the CLI; a KvtierError becomes a one-line message and exit code 2, no traceback."""
    try:
        cli(standalone_mode=False)
    except KvtierError as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as exc:  # click usage errors carry their own exit code
        import click
        from typer.exceptions import TyperException  # typer >= 0.2x vendors its own click

        if isinstance(exc, click.ClickException | TyperException):
            show = getattr(exc, "show", None)
            if show is not None:
                show()
            else:
                typer.secho(f"error: {exc.format_message()}", err=True, fg=typer.colors.RED)
            sys.exit(exc.exit_code)
        raise
