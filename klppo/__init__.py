"""klppo: KL-controlled policy optimisation."""
__version__ = "0.1.0"
