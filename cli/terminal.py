"""The one presentation object of the CLI: it owns both consoles.

Data (tables, JSON, host lists) goes to stdout so it can be piped; messages
(notes, warnings, errors, spinners) go to stderr. Messages are printed without
Rich markup or highlighting, because they quote operator input and TOML table
names such as `[nodes.primary]`, and without wrapping, so one sentence stays on
one line whatever the terminal width.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

# Rich is imported when something is printed, and the consoles are made then: `pairmq node` (every node start)
# prints nothing unless it fails, and should not pay for importing Rich.
if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live
    from rich.status import Status


# Piped or redirected output has no terminal to fit: tables are laid out this
# wide instead of Rich's 80 columns, so a log file keeps every column (COLUMNS wins).
PIPE_WIDTH = 160


def _stdout_console() -> Console:
    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=PIPE_WIDTH)
    return console


class Terminal:
    def __init__(self, out: Console | None = None, err: Console | None = None) -> None:
        self._out, self._err = out, err

    @property
    def out(self) -> Console:
        if self._out is None:
            self._out = _stdout_console()
        return self._out

    @property
    def err(self) -> Console:
        if self._err is None:
            from rich.console import Console

            self._err = Console(stderr=True, highlight=False)
        return self._err

    # --- data: stdout ------------------------------------------------------------

    def print(self, renderable: RenderableType) -> None:
        self.out.print(renderable)

    def print_table(self, table: RenderableType) -> None:
        self.out.print(table)

    def print_text(self, text: str) -> None:
        """A plain line of data (a host list, a command): never wrapped, never styled."""
        from rich.text import Text

        self.out.print(Text(text), soft_wrap=True, highlight=False)

    def print_json(self, document: object) -> None:
        if self.out.is_terminal:
            self.out.print_json(data=document, indent=2)
        else:
            # Byte-stable for scripts: no highlighting, no wrapping, no Rich involvement.
            self.out.file.write(json.dumps(document, indent=2) + "\n")
            self.out.file.flush()

    @contextlib.contextmanager
    def live(self, renderable: RenderableType, refresh_per_second: float = 4) -> Iterator[Live]:
        from rich.live import Live

        with Live(renderable, console=self.out, refresh_per_second=refresh_per_second) as live:
            yield live

    # --- messages: stderr ----------------------------------------------------------

    def note(self, sentence: str) -> None:
        from rich.text import Text

        self.err.print(Text(sentence), soft_wrap=True)

    def warn(self, sentence: str) -> None:
        from rich.text import Text

        self.err.print(Text.assemble(("warning: ", "bold yellow"), sentence), soft_wrap=True)

    def error(self, sentence: str) -> None:
        from rich.text import Text

        self.err.print(Text.assemble(("error: ", "bold red"), sentence), soft_wrap=True)

    def detail(self, text: str) -> None:
        """Verbatim supporting lines after a message (e.g. the tail of a log), dimmed."""
        from rich.text import Text

        self.err.print(Text(text, style="dim"), soft_wrap=True)

    def status(self, message: str) -> Status:
        """A spinner on stderr; use as a context manager and call .update(text)."""
        from rich.text import Text

        return self.err.status(Text(message), spinner="dots")
