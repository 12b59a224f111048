"""The one presentation object of the CLI: it owns both consoles.

Data (tables, JSON, host lists) goes to stdout so it can be piped; messages
(notes, warnings, errors, spinners) go to stderr. Messages are printed without
Rich markup or highlighting, because they quote operator input and TOML table
names such as `[nodes.primary]`, and without wrapping, so one sentence stays on
one line whatever the terminal width.

With `--json` (every command has it) stdout carries exactly one JSON
document: a command that prints its own (reads) prints it; for any other the
terminal builds it from what the command `record`s, its lines of data and its
notes, and `finish` prints it. An error is a JSON document too, with the same
exit code. Tables are not printed then: the command records their data.
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
        self.json_mode = False
        self._document: dict = {}  # what a --json run records, printed by `finish`
        self._lines: list[str] = []
        self._messages: list[str] = []
        self._printed_json = False
        self._finished = False

    # --- the --json document ----------------------------------------------------------

    def record(self, **fields: object) -> None:
        """Data for the --json document (ignored without --json: the command prints it its own way)."""
        self._document.update(fields)

    def finish(self, code: int) -> None:
        """End of a --json run: print the document unless the command printed its own."""
        if not self.json_mode or self._finished:
            return
        self._finished = True
        if self._printed_json:
            self._flush_messages()
            return
        document: dict = {"schema": 1, "ok": code == 0, "exit_code": code, **self._document}
        if self._lines:
            document["lines"] = self._lines
        document["messages"] = self._messages
        self._write_json(document)

    def fail(self, sentence: str) -> None:
        """An error ends the command: one sentence on stderr and, with --json, in the document `finish` prints."""
        self.error(sentence)
        self._document["error"] = sentence

    def _flush_messages(self) -> None:
        from rich.text import Text

        for sentence in self._messages:
            self.err.print(Text(sentence), soft_wrap=True)
        self._messages = []

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
        if not self.json_mode:
            self.out.print(renderable)

    def print_table(self, table: RenderableType) -> None:
        if not self.json_mode:
            self.out.print(table)

    def print_text(self, text: str) -> None:
        """A plain line of data (a host list, a command): never wrapped, never styled."""
        if self.json_mode:
            self._lines.append(text)
            return
        from rich.text import Text

        self.out.print(Text(text), soft_wrap=True, highlight=False)

    def print_json(self, document: object) -> None:
        self._printed_json = True
        self._write_json(document)

    def print_json_line(self, document: object) -> None:
        """One object of a stream (JSON Lines: `events follow`, `sub`), flushed at once."""
        self._printed_json = True
        self.out.file.write(json.dumps(document) + "\n")
        self.out.file.flush()

    def _write_json(self, document: object) -> None:
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
        if self.json_mode:
            self._messages.append(sentence)
            return
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

        if self.json_mode:
            return contextlib.nullcontext(_NoStatus())  # type: ignore[return-value]
        return self.err.status(Text(message), spinner="dots")


class _NoStatus:
    """A spinner that shows nothing: a --json run keeps stderr for warnings and errors."""

    def update(self, *args: object, **kwargs: object) -> None:
        pass
