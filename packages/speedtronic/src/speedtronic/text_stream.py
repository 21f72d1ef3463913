"""Sampled text handed on as it is generated: a streamer for a model's generate()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# What a decoder gives for a UTF-8 sequence whose last bytes (tokens) are still to come.
REPLACEMENT = "\ufffd"


class TextStream:
    """A streamer (put(ids), end(), as transformers' TextStreamer) for one sequence that hands
    on_text each new piece of its text once it is stable. Each token decodes a short window, not
    the whole growing list: the ids since the last piece (new) after those of the piece before
    (context, so a decoder that treats a first token apart, as SentencePiece's leading space, gives
    the text the whole list would). A trailing incomplete UTF-8 character (U+FFFD) waits for its
    last byte; text a decoder rewrote waits until the window extends what was shown again.
    """

    def __init__(self, codec: Any, prompt_ids: list[int], on_text: Callable[[str], None]) -> None:
        self.codec, self.ids, self.on_text = codec, list(prompt_ids), on_text
        self.shown = ""  # the text handed on so far
        self.context = self.new = 0  # where the window's context and its new ids begin
        self.prompt_put = False
        self._hand_on_new()

    def put(self, ids: Any) -> None:
        """Take the prompt (put first: already known) or one step's (1,) sampled ids."""
        if not self.prompt_put:
            self.prompt_put = True
            return
        self.ids.extend(ids.reshape(-1).tolist())
        self._hand_on_new()

    def end(self) -> None:
        """Nothing: close() hands on the rest, from the ids generate() returned."""

    def close(self, text: str) -> None:
        """Hand on the rest of the final text, a trailing U+FFFD included, where it extends what
        was shown.
        """
        if len(text) > len(self.shown) and text.startswith(self.shown):
            self.on_text(text[len(self.shown) :])
            self.shown = text

    def _hand_on_new(self) -> None:
        window = self.codec.decode(self.ids[self.context :])
        before = self.codec.decode(self.ids[self.context : self.new])
        if len(window) > len(before) and window.startswith(before):
            piece = window[len(before) :]
            if not piece.endswith(REPLACEMENT):
                self.on_text(piece)
                self.shown += piece
                self.context, self.new = self.new, len(self.ids)
