"""The wizard: its state (no Textual), the Textual app and its steps, and the plain (--plain) prompts."""
