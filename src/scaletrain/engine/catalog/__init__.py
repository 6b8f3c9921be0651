"""What the planner knows about the world: model architectures (models/*.json, exact parameter counts) and GPUs."""
