"""What makes one experiment: the typed config schema and its Hydra registration, composition, validation,
the model built from a config, and the settings a resume or an evaluation may change. Imports core, data, model."""
