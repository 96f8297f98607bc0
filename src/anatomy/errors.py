"""The project's exception types: every error a user can provoke is one of these."""


class AnatomyError(Exception):
    """Base class of every error anatomy raises on bad input."""


class ConfigError(AnatomyError, ValueError):
    """A model configuration breaks a rule (names the field, the value and the rule)."""


class InputError(AnatomyError, ValueError):
    """Bad input to a model or an API call: token ids, lengths, batch sizes, options."""


class CheckpointError(AnatomyError):
    """A checkpoint file is missing, malformed or does not fit the model (names file, field, value)."""


class ParallelError(AnatomyError):
    """A tensor- or pipeline-parallel run lost a rank: it died, or stopped answering within the timeout."""
