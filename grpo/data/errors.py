"""The data package's exception type."""


class DataError(ValueError):
    """A dataset cannot be loaded or prepared: a bad file, a bad row, too many unparsable gold answers,
    or an unreachable hub. The message names the dataset or file (and the row) so the user can fix it.
    A ValueError, so a stage reports it as one clear line instead of a traceback."""
