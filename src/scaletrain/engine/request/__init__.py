"""What the user asks, resolved in one place: the plan request and its checks, presets, train options, the weights
and the data a run starts from, and the translation from parsed front-end arguments (args.py)."""
