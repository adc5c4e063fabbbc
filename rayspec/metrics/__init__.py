"""A running study's Ray metrics, read from its own node's exporter.

``python -m rayspec.metrics STUDY_FOLDER`` prints them; the driver records where they are
exported in the study folder (:data:`EXPORTER_FILE`) when it starts its cluster.
"""

from rayspec.metrics._read import EXPORTER_FILE
from rayspec.metrics._read import MetricsUnavailable
from rayspec.metrics._read import read_study_metrics
from rayspec.metrics._read import write_exporter_file

__all__ = ["EXPORTER_FILE", "MetricsUnavailable", "read_study_metrics", "write_exporter_file"]
