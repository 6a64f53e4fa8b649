"""The apps a Flower deployment loads (components of the app folder :func:`subfl.flower.deployment.write_app`
writes): ``serverapp = "subfl.flower.app:server_app"``, ``clientapp = "subfl.flower.app:client_app"``."""
from __future__ import annotations

from .client import client_app
from .server import server_app

__all__ = ["client_app", "server_app"]
