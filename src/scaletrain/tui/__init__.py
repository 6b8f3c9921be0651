"""The terminal front ends. Nothing in engine/ imports from here."""
