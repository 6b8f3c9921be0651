"""Textual widgets shared by the wizard and the monitor, one per file."""
