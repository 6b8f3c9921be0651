"""The bundled trainer (`python -m scaletrain.trainer.train`): its data, model, distribution, checkpoints and export,
and the TRL objectives (reward, DPO, GRPO). It only trains; the measurements live in scaletrain/measure/."""
