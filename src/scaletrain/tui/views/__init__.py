"""Rich renderings of engine results for the CLI and the wizard's panels (formatting only)."""
