"""The trajectory API: accepts scored groups from environments, serves exact batches to trainers."""

from atropos.api.app import ApiConfig, create_app

__all__ = ["ApiConfig", "create_app"]
