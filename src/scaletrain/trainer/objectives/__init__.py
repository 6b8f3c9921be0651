"""Reward models, DPO and GRPO with TRL (RewardTrainer, DPOTrainer, GRPOTrainer): the bundled trainer's objectives
beyond supervised fine-tuning. build.py makes the TRL trainer a run (or a measurement) asks for, run.py drives it
inside a run directory, measure.py profiles one of its steps (the CPU ground truth of the objectives' memory terms)."""
