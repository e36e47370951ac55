"""Framework integrations. Import the one you use; each imports its framework
lazily and works (as a plain class) when the framework is not installed:

* ``trainmeter.integrations.hf.TrainmeterCallback`` — Hugging Face ``Trainer``
* ``trainmeter.integrations.lightning.TrainmeterCallback`` — PyTorch Lightning
* ``trainmeter.integrations.mlflow.attach`` / ``trainmeter.integrations.wandb.attach``
  — log the run's trainmeter figures into an MLflow / W&B run (the callbacks
  do it when the trainer reports there)
"""
