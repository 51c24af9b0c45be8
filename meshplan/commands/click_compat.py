"""click as typer ships it: the one place the CLI reaches click's own modules."""


def click_exceptions():
    """click's exceptions module (``UsageError``, ``BadParameter``, ``Abort``, ...): typer
    >= 0.2x vendors click as ``typer._click``; older typer depends on the click
    distribution."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions  # type: ignore[no-redef]
    return exceptions
