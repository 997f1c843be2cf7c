"""Calls between markers, read out of a sequence's text as it streams (`MarkedCallScanner`).

Text outside a call passes through; from one of the format's openings
(worker/engine/sequence/calls/families/syntax.py's `Opening`: a start marker and its end marker,
or none: the call runs to the end of the sequence) the text goes to a reader of the format
(worker/engine/sequence/calls/call_readers.py), which says what may be sent of the call as it
is written, and at the end marker gives the call or calls. A suffix that could still become a
start or end marker is held back, so a client never sees part of one. Text between markers that
is no call is shown as it was written.
"""

from __future__ import annotations

from collections.abc import Callable

from worker.engine.sequence.calls.call_readers import CallReader
from worker.engine.sequence.calls.families.syntax import Opening
from worker.engine.sequence.calls.scanned_calls import CallNumbering, Scanned


class MarkedCallScanner:
    """Calls between a start and an end marker, read by a reader of the family's format."""

    def __init__(self, openings: tuple[Opening, ...], reader: Callable[[], CallReader]):
        self._openings = openings
        self._new_reader = reader
        self._buffer = ""
        self._reader: CallReader | None = None  # set while inside a call
        self._opening: Opening | None = None  # the opening of the call being read
        self._body: list[str] = []  # the call's text, shown as written if it is no call
        self._numbering = CallNumbering()

    @property
    def made(self) -> int:
        return self._numbering.made

    def feed(self, text: str) -> Scanned:
        """What `text` gives: the text that may be shown now, call pieces, completed calls."""
        self._buffer += text
        got = Scanned()
        shown: list[str] = []
        while True:
            found = self._next_marker()
            if found is None:
                keep = self._held_back()
                rest = self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
                if self._reader is None:
                    shown.append(rest)
                else:
                    self._inside(rest, got)
                got.text = "".join(shown)
                return got
            at, marker, opening = found
            before, self._buffer = self._buffer[:at], self._buffer[at + len(marker) :]
            if self._reader is None:
                shown.append(before)
                self._reader, self._opening, self._body = self._new_reader(), opening, []
                if opening.kept:
                    self._inside(marker, got)
            else:
                self._inside(before + (marker if opening.kept else ""), got)
                shown.append(self._close(got, ended=True))

    def finish(self) -> Scanned:
        """At the end of the sequence: what is still held back. A call whose end marker never
        came is read as it stands (models often end on their stop token instead, and some
        formats have no end marker)."""
        got = Scanned()
        rest, self._buffer = self._buffer, ""
        if self._reader is None:
            got.text = rest
        else:
            self._inside(rest, got)
            got.text = self._close(got, ended=False)
        return got

    def _next_marker(self) -> tuple[int, str, Opening] | None:
        """The first marker in the buffer: inside a call its end, outside the earliest start
        (the longest, where two begin at the same place)."""
        if self._opening is not None:
            end = self._opening.end
            at = -1 if end is None else self._buffer.find(end)
            return None if end is None or at < 0 else (at, end, self._opening)
        found = [(self._buffer.find(o.start), -len(o.start), o) for o in self._openings]
        starts = [(at, size, o) for at, size, o in found if at >= 0]
        if not starts:
            return None
        at, _, opening = min(starts, key=lambda s: (s[0], s[1]))
        return at, opening.start, opening

    def _held_back(self) -> int:
        """How much of the buffer's end could still become the marker looked for."""
        if self._opening is not None:
            end = self._opening.end
            return 0 if end is None else _partial_suffix(self._buffer, end)
        return max(_partial_suffix(self._buffer, o.start) for o in self._openings)

    def _inside(self, text: str, got: Scanned) -> None:
        assert self._reader is not None
        self._body.append(text)
        got.deltas += [self._numbering.delta(piece) for piece in self._reader.feed(text)]

    def _close(self, got: Scanned, ended: bool) -> str:
        """The call's end (at its end marker, or the sequence's): the calls are complete, or
        it is no call and its text is shown as written."""
        assert self._reader is not None and self._opening is not None
        pieces, calls = self._reader.close()
        opening, self._reader, self._opening = self._opening, None, None
        got.deltas += [self._numbering.delta(piece) for piece in pieces]
        if not calls:
            if opening.kept:
                return "".join(self._body)
            return opening.start + "".join(self._body) + ((opening.end or "") if ended else "")
        got.calls += [self._numbering.call(call) for call in calls]
        return ""


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
