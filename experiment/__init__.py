"""What makes one experiment: the typed config schema and its Hydra registration, composition, validation,
the model built from a config, and the settings a resume or an evaluation may change. Imports core, data, model."""

from pathlib import Path

# configs/, the YAML files Hydra composes (here, where importing it costs nothing: a script's options name them)
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
