"""The bundled trainer (`python -m scaletrain.trainer.train`), its data, and the measurements that check the model."""
