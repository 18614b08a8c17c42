"""NeuroFed command-line shell: assembles the ``neurofed`` CLI from each package's commands."""

__version__ = "0.1.0"
