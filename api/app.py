"""The Flask app: its extensions, error handlers and blueprints, put together (`create_app`)."""

from __future__ import annotations

from flask import Flask

from api.backend import Backend
from api.http import auth, errors, exposure
from api.limits import open_requests, quotas, shares
from api.queue.broker import Broker
from api.queue.roster import Roster
from api.routes import (
    chat,
    completions,
    embeddings,
    fleet,
    health,
    metrics,
    models,
    openapi,
    page,
    responses,
)
from api.routes.anthropic import message_batches, messages
from api.routes.batch import batches, files
from api.stores import replicas
from shared.queue.config import Settings


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or Settings()
    app = Flask(__name__)  # static files: the page's (api/routes/page.py, api/static/)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    b = Backend(settings)
    b.init_app(app)
    served = Roster(b)
    served.init_app(app)
    Broker(b, served).init_app(app)
    errors.init_app(app)
    exposure.init_app(app, settings)  # before the key check
    auth.init_app(app, settings, b.redis)
    shares.init_app(app, b)
    open_requests.init_app(app, b)
    replicas.init_app(app, b)
    quotas.init_app(app, b)
    for blueprint in (chat.bp, completions.bp, models.bp, health.bp, openapi.bp):
        app.register_blueprint(blueprint)
    for blueprint in (responses.bp, files.bp, batches.bp, fleet.bp, embeddings.bp):
        app.register_blueprint(blueprint)
    for blueprint in (messages.bp, message_batches.bp):
        app.register_blueprint(blueprint)
    metrics.init_app(app, b)
    page.init_app(app)
    return app
