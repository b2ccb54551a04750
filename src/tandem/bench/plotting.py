"""What every bench's PNG plots share: matplotlib without a display, and one resolution."""

DPI = 120


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported on first use: plotting is optional work)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
