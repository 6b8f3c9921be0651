"""A labelled one-line text field with its message line: hints normally, the refusal when input is bad."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Static


class Field(Vertical):
    """Label + Input on one row, a message row under it. The Input's id is `in-<name>`."""

    def __init__(self, name: str, label: str, value: str = "", *, placeholder: str = "", hint: str = "",
                 **kwargs) -> None:
        super().__init__(id=f"field-{name}", classes="field", **kwargs)
        self.field_name = name
        self._label = label
        self._value = value
        self._placeholder = placeholder
        self.hint = hint

    def compose(self) -> ComposeResult:
        with Horizontal(classes="field-row"):
            yield Label(self._label, classes="field-label")
            yield Input(self._value, placeholder=self._placeholder, id=f"in-{self.field_name}")
        yield Static(self.hint, classes="field-msg", markup=False)

    @property
    def input(self) -> Input:
        return self.query_one(Input)

    @property
    def value(self) -> str:
        return self.input.value

    @value.setter
    def value(self, text: str) -> None:
        self.input.value = text

    def show_error(self, message: str | None) -> None:
        """Show `message` in place (None: back to the hint)."""
        msg = self.query_one(".field-msg", Static)
        if message:
            msg.update(message)
            self.add_class("-invalid")
        else:
            msg.update(self.hint)
            self.remove_class("-invalid")

    def set_hint(self, hint: str) -> None:
        self.hint = hint
        if not self.has_class("-invalid"):
            self.query_one(".field-msg", Static).update(hint)

    @property
    def invalid(self) -> bool:
        return self.has_class("-invalid")
