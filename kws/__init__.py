"""kwsflow: the library behind the keyword-spotting pipeline (no Snakemake inside)."""

__version__ = "0.1.0"
