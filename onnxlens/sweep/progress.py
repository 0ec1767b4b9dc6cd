"""The sweep's progress bar: rows done of all, failures so far, time left."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .driver import Progress as Callback


@contextmanager
def sweep_progress(console: Console) -> Iterator[Callback]:
    with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("rows, {task.fields[failed]} failed"), TextColumn("ETA"),
                  TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("sweep", total=None, failed=0)

        def update(done: int, total: int, failed: int) -> None:
            bar.update(task, completed=done, total=total, failed=failed)

        yield update
