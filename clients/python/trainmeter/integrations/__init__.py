"""Framework integrations. Import the one you use; each imports its framework
lazily and works (as a plain class) when the framework is not installed:

* ``trainmeter.integrations.hf.TrainmeterCallback`` — Hugging Face ``Trainer``
* ``trainmeter.integrations.lightning.TrainmeterCallback`` — PyTorch Lightning
"""
